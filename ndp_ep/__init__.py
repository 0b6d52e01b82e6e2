"""ndp-ep: an ONNX Runtime execution-provider prototype for MoE models on GPU + NDP-DIMM systems."""

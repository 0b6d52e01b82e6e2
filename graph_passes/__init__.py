"""Graph passes that find MoE blocks in ONNX graphs and rewrite them into sharded expert ops."""

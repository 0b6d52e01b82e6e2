"""ONNX Runtime session options for ``ndp_ep.InferenceSession``: the caller's copied (the session adds its provider to
the copy, never to the caller's object), and those of a program that runs a model once (``ndp-ep run``)."""

from __future__ import annotations

import functools
import weakref

from ndp_ep.ep import config_entry

# the session config keys ONNX Runtime defines (all 67 of onnxruntime_session_options_config_keys.h, 1.27). ONNX
# Runtime lists no entries of a SessionOptions, so a copy can only ask for known keys, one call each (~40 us when
# absent)
_SESSION_CONFIG_KEYS = (
    "session.disable_prepacking",
    "session.use_env_allocators",
    "session.load_model_format",
    "session.save_model_format",
    "session.set_denormal_as_zero",
    "session.disable_quant_qdq",
    "session.disable_qdq_constant_folding",
    "session.disable_double_qdq_remover",
    "session.enable_quant_qdq_cleanup",
    "optimization.enable_gelu_approximation",
    "optimization.enable_cast_chain_elimination",
    "session.disable_aot_function_inlining",
    "optimization.memory_optimizer_config",
    "optimization.enable_memory_probe_recompute_config",
    "optimization.disable_specified_optimizers",
    "optimization.constant_folding_max_output_size_in_bytes",
    "session.graph_optimizations_loop_level",
    "session.use_device_allocator_for_initializers",
    "session.inter_op.allow_spinning",
    "session.intra_op.allow_spinning",
    "session.intra_op.spin_duration_us",
    "session.inter_op.spin_duration_us",
    "session.intra_op.spin_backoff_max",
    "session.inter_op.spin_backoff_max",
    "session.use_ort_model_bytes_directly",
    "session.use_ort_model_bytes_for_initializers",
    "session.use_memory_mapped_ort_model",
    "session.qdqisint8allowed",
    "session.x64quantprecision",
    "optimization.minimal_build_optimizations",
    "ep.nnapi.partitioning_stop_ops",
    "session.dynamic_block_base",
    "session.force_spinning_stop",
    "session.strict_shape_type_inference",
    "session.allow_released_opsets_only",
    "session.node_partition_config_file",
    "session.intra_op_thread_affinities",
    "session.debug_layout_transformation",
    "session.disable_cpu_ep_fallback",
    "session.optimized_model_external_initializers_file_name",
    "session.optimized_model_external_initializers_min_size_in_bytes",
    "session.model_external_initializers_file_folder_path",
    "session.save_external_prepacked_constant_initializers",
    "session.collect_node_memory_stats_to_file",
    "session.resource_cuda_partitioning_settings",
    "session.layer_assignment_settings",
    "ep.context_enable",
    "ep.context_file_path",
    "ep.context_embed_mode",
    "ep.context_node_name_prefix",
    "ep.share_ep_contexts",
    "ep.stop_share_ep_contexts",
    "ep.context_model_external_initializers_file_name",
    "session.compile_only",
    "mlas.enable_gemm_fastmath_arm64_bfloat16",
    "mlas.use_lut_gemm",
    "mlas.disable_kleidiai",
    "mlas.kleidiai.conv_igemm_max_work",
    "session.qdq_matmulnbits_accuracy_level",
    "session.qdq_matmulnbits_block_size",
    "session.enable_dq_matmulnbits_fusion",
    "ep.dynamic.workload_type",
    "session.disable_model_compile",
    "session.fail_on_suboptimal_compiled_model",
    "ep.dynamic.qnn_htp_performance_mode",
    "session.record_ep_graph_assignment_info",
    "ep.enable_weightless_ep_context_nodes",
)
# SessionOptions made by one_run_session_options -> the config entries it set (its copy needs no probing)
_entries_set: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def one_run_session_options():
    """Session options for a program that runs a model once (``ndp-ep run``): ONNX Runtime's intra-op threads
    sleep between parallel sections instead of spinning (spinning only shortens back-to-back runs; after the one
    run it would take a core from the report being built), and warnings stay quiet as in :class:`InferenceSession`'s
    own options (every session would warn that the non-expert nodes run on the CPU provider). Its copy
    (:func:`copy_session_options`) takes the entries it set from here, not by asking for every known key (~2 ms)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    entries = {"session.intra_op.allow_spinning": "0"}
    for key, value in entries.items():
        options.add_session_config_entry(key, value)
    _entries_set[options] = entries
    return options


def copy_session_options(options):
    """A fresh SessionOptions with the caller's settings: every settable attribute (threads, optimization level,
    logging, profiling, memory...) and every config entry of :data:`_SESSION_CONFIG_KEYS` it holds. Adding the
    provider to the caller's own object would make a second session created with it fail (the provider would be
    added twice). What ONNX Runtime cannot read back is not copied: free dimension overrides, initializers added
    to the options, custom op libraries registered on them, config entries of other keys."""
    import onnxruntime as ort

    fresh = ort.SessionOptions()
    # ONNX Runtime warns on every session that some nodes (the non-expert ones) are not on the first provider
    fresh.log_severity_level = 3
    if options is not None:
        for name in _settable_attributes():
            value = getattr(options, name)
            if name == "log_severity_level" and value < 0:  # ONNX Runtime's default, not the caller's choice
                continue
            setattr(fresh, name, value)
        entries = _entries_set.get(options)
        if entries is None:
            entries = {key: value for key in _SESSION_CONFIG_KEYS if (value := config_entry(options, key)) is not None}
        for key, value in entries.items():
            fresh.add_session_config_entry(key, value)
    return fresh


@functools.cache
def _settable_attributes() -> tuple[str, ...]:
    """The settable attributes of ONNX Runtime's SessionOptions (read once)."""
    import onnxruntime as ort

    return tuple(
        sorted(
            name
            for name, value in vars(ort.SessionOptions).items()
            if isinstance(value, property) and value.fset is not None and not name.startswith("_")
        )
    )


__all__ = ["copy_session_options", "one_run_session_options"]

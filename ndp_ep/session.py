"""``ndp_ep.InferenceSession``: an ONNX Runtime session on the native NDP execution provider, with reports.

    sess = ndp_ep.InferenceSession("model.onnx", hw="paper")
    outputs = sess.run(None, {"input_ids": ids})
    print(sess.last_report.simulated_latency_s)

It takes ONNX Runtime's arguments (``path_or_bytes, sess_options, providers, provider_options, **kwargs``;
a path, serialized bytes or an ``onnx.ModelProto``) plus keyword-only ``hw``, ``ndp_units``, ``policy``,
``shards``, ``strict``, ``dtype``, ``report_ring``, ``routing_capacity`` and ``input_shapes``. Given an
unconverted model it converts the MoE blocks in memory (as an execution provider claims the nodes it can run);
given a converted one it hands it to ONNX Runtime as is. Underneath is a real ``onnxruntime.InferenceSession``
whose options add ``NdpExecutionProvider`` (:func:`ndp_ep.ep.add_provider`): the provider runs the sharded expert
nodes natively and records their routing; ONNX Runtime's CPU provider runs the rest. Every method of ONNX Runtime's
session is available (delegated); ``run`` and ``run_with_ort_values`` additionally tag the run with its input
shapes so its report can cost the non-expert GPU work (a RunOptions of its own carries the tag; a caller's goes to
ONNX Runtime untouched, so setting its ``terminate`` cancels the run, and the tag goes to the calling thread's next
run). ``run`` and ``run_with_ort_values`` raise :class:`FeedError` for feeds that do not
fit the inputs and :class:`RunError` for a run that fails, where ONNX Runtime raises its own errors;
``run_with_iobinding`` is ONNX Runtime's as it is (an ``IOBinding``'s inputs cannot be read back to be checked,
and its report costs the expert side only).
Reports are built lazily (:mod:`ndp_ep.reporter`), in a bounded ring. Once the model is checked (and
converted), ONNX Runtime builds its session on a thread of its own while this one sets up the reports (ONNX
Runtime does not hold the GIL meanwhile); a model handed over as it is (already converted) gets the last of its
checks (onnx's schemas, operators ONNX Runtime knows) in that time too, after the reports'
set-up (Python, which ONNX Runtime's thread cuts into between loading and compiling the model, where the
check's ~10 ms call into onnx would keep it waiting), and a failure drops the session (:func:`_load` says which
checks come first; an error setting up the reports is raised only when those checks pass).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hw_model.hardware import SystemSpec
from ndp_ep.ep import (
    EP_NAME,
    OPTION_PREFIX,
    REGISTER_HINT,
    RUN_TAG_KEY,
    SESSION_KEY_OPTION,
    add_provider,
    check_positive,
    config_entry,
    native,
    new_session_key,
    settings_of,
)
from ndp_ep.errors import FeedError, ModelLoadError, NdpEpError, RunError, graph_pass_errors
from ndp_ep.ort_options import copy_session_options, one_run_session_options
from ndp_ep.partition import annotate_placement, claim
from ndp_ep.profiling import add_simulated_tracks
from ndp_ep.report import RunReport
from ndp_ep.reporter import DEFAULT_REPORT_RING, DEPLOYMENT_DTYPE, SessionReporter
from ndp_ep.routing import reporter_trace
from ndp_ep.slots import attach, slot_capture

if TYPE_CHECKING:
    import onnx

    from hw_model.settings import SimulationSettings

PROVIDER_NAME = EP_NAME
_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
    "tensor(int16)": np.int16,
}


class InferenceSession:
    """An ONNX Runtime session whose MoE experts run on the NDP provider (see the module docstring).

    ``settings``: the run's :class:`hw_model.SimulationSettings` (hardware, NDP units, policy, dtype, the
    simulator's knobs), or instead the keyword arguments it is built from (an out-of-range or unknown one raises
    :class:`hw_model.SettingsError` naming it): ``hw``, a preset name, a TOML file or a :class:`SystemSpec`
    (default ``paper``); ``ndp_units`` overrides its unit count (1 to 64); ``policy``: a scheduling policy of
    :data:`hw_model.POLICIES` (default ``tp+lb+prefetch``); ``shards``:
    shards per expert when converting in memory (default: the NDP unit count); ``strict``: a skipped MoE block
    raises :class:`ConversionError`; ``dtype``: the dtype the report costs every expert's weights in (default:
    quantized experts as stored, float experts in bf16, the deployment dtype); ``report_ring``: how
    many reports the session keeps; ``routing_capacity``: the routing records the provider keeps while no report
    is read (the EP option of that name; default 16384 layer invocations, older ones are dropped, counted and
    noted in the next reports); ``capture_routing``: True records every run's routing for :meth:`routing_trace`,
    ``"slots"`` every token slot's expert id and weight too (:mod:`ndp_ep.slots`); ``pre_gating``: True predicts
    each layer's experts from the previous layer's hidden state with its own router, scores each run's predictions
    (its report's ``pre_gating``, the session's :attr:`pre_gating`) and gives them to a look-ahead policy's prefetcher
    (:mod:`ndp_ep.pregating`); ``input_shapes``: the input
    shapes of the runs to come, when known
    (``{name: shape}``): their non-expert GPU cost is computed while ONNX Runtime builds the session instead
    of at the first report (the same figures either way). ``sess_options`` is copied, not modified: its
    attributes and the config entries ONNX Runtime defines (:func:`copy_session_options`; free dimension
    overrides, initializers and custom op libraries added to it cannot be read back, so they are not copied).
    ``providers`` and ``provider_options`` are accepted for ONNX Runtime compatibility: the session always runs
    on ``NdpExecutionProvider`` with ONNX Runtime's CPU provider for the other nodes (a warning names any other
    provider requested), and ``get_providers()`` says so.
    """

    def __init__(
        self,
        path_or_bytes: str | Path | bytes | Any,
        sess_options=None,
        providers: Sequence[str] | None = None,
        provider_options: Sequence[dict] | None = None,
        *,
        settings: SimulationSettings | None = None,
        hw: str | Path | SystemSpec | None = None,
        ndp_units: int | None = None,
        policy: str | None = None,
        shards: int | None = None,
        strict: bool = False,
        dtype: str | None = None,
        report_ring: int = DEFAULT_REPORT_RING,
        routing_capacity: int | None = None,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        capture_routing: bool | str = False,
        pre_gating: bool = False,
        **kwargs,
    ) -> None:
        _check_no_provider_added(sess_options)  # before the model is read: refused options are refused at once
        _check_requested_providers(providers, provider_options)
        self.settings = settings_of(settings, hw=hw, ndp_units=ndp_units, policy=policy, dtype=dtype)
        self.system = self.settings.system
        check_positive("shards", shards)
        check_positive("routing_capacity", routing_capacity)
        _check_input_shapes(input_shapes)
        self.dtype = self.settings.dtype or DEPLOYMENT_DTYPE  # what non-expert work is costed in
        proto, base_dir, source_path = _load(path_or_bytes)  # checked but for :func:`_finish_checks`
        claimed = _claim(proto)
        checks_pending = bool(claimed)
        if claimed:
            converted = proto
            self._conversion_report = None  # built on first use: the graph passes stay unimported
            ort_model: str | bytes = str(source_path) if source_path is not None else _serialize(proto, base_dir)
        else:
            _finish_checks(proto)  # before the graph passes read it
            converted, self._conversion_report = _convert(
                proto, shards or max(self.system.num_ndp_units, 1), strict, base_dir
            )
            claimed = _claim(converted)
            ort_model = converted.SerializeToString()
        self.converted_model = converted
        self._slots, ort_model = slot_capture(capture_routing, converted, claimed, ort_model, base_dir, pre_gating)
        self.session_key = new_session_key()
        # only the options the library reads: the reports take the settings from this object, not the session's
        # config entries (which a plain session created with session_options reports from)
        options = add_provider(
            copy_session_options(sess_options),
            {
                "session_key": self.session_key,
                "routing_capacity": routing_capacity,  # absent: the library's default
            },
        )
        self.requested_providers = list(providers or [])
        self.requested_provider_options = list(provider_options or [])
        # ONNX Runtime builds the session without holding the GIL: the reports' side is set up meanwhile
        creating = _SessionCreation(ort_model, options, kwargs)
        try:
            try:  # Python first, which ONNX Runtime's thread can cut into between its loading and compiling steps
                self.reporter = SessionReporter(
                    converted,
                    self.settings,
                    self.session_key,
                    report_ring=report_ring,
                    claimed=claimed,
                    notes=_skip_notes(self._conversion_report) if self._conversion_report is not None else (),
                )
                self.reporter.prepare_costing(input_shapes)
                attach(self._slots, self.reporter, capture_routing)  # the routing capture, the pre-gating
            except BaseException:
                if checks_pending:  # an error they find comes first, as when they ran first
                    _finish_checks(proto)
                raise
            if checks_pending:  # a model handed to ONNX Runtime as it is: its last checks, meanwhile (onnx's
                _finish_checks(proto)  # schema registry, built here, holds the GIL ~10 ms in one call)
            self.policy = self.settings.policy
            annotate_placement(converted, self.system, self.policy, claimed)
        except BaseException:  # this error is the one raised (the session is dropped), as when it came first
            creating.wait()
            raise
        self._session = creating.result()
        self._inputs = {i.name: i for i in self._session.get_inputs()}
        self._has_moe = bool(claimed)
        self._run_finished = self.reporter.run_finished
        self._tags = itertools.count(1)
        self._tag_lock = threading.Lock()

    @property
    def conversion_report(self):
        """What the in-memory conversion did (:class:`graph_passes.convert.ConversionReport`)."""
        if self._conversion_report is None:
            from graph_passes.convert import ConversionReport

            self._conversion_report = ConversionReport(notes=("model was already converted",))
        return self._conversion_report

    # -- ONNX Runtime's API ------------------------------------------------------------------------------
    def __getattr__(self, name: str):
        # everything this class does not define: io_binding, run_with_iobinding, end_profiling, get_inputs...
        if name == "_session":
            raise AttributeError(name)
        return getattr(self._session, name)

    def get_providers(self) -> list[str]:
        return self._session.get_providers()

    def get_outputs(self):  # without the outputs capture_routing="slots" added
        return self._session.get_outputs()[: len(self._slots.outputs)] if self._slots else self._session.get_outputs()

    def run(self, output_names, input_feed: Mapping[str, Any], run_options=None) -> list:
        """ONNX Runtime's ``run``; feeds that do not match the inputs raise :class:`FeedError`, a failing run
        :class:`RunError`."""
        _check_mapping(input_feed)
        shapes = {name: tuple(np.shape(value)) for name, value in input_feed.items()}
        # ONNX Runtime reads an array's bytes in this machine's order whatever its dtype says (a big-endian int64
        # [1, 2] ran as [72057594037927936, ...]): such a feed is converted, its values kept
        input_feed = {
            name: value.astype(value.dtype.newbyteorder("="))
            if isinstance(value, np.ndarray) and not value.dtype.isnative
            else value
            for name, value in input_feed.items()
        }
        return self._tagged_run(self._session.run, output_names, input_feed, run_options, shapes, _array_signature)

    def run_with_ort_values(self, output_names, input_dict_ort_values: Mapping[str, Any], run_options=None) -> list:
        """ONNX Runtime's ``run_with_ort_values`` (its ``OrtValue`` results); feeds that do not match the inputs
        raise :class:`FeedError`, a failing run :class:`RunError`."""
        _check_mapping(input_dict_ort_values)
        shapes = {name: _ort_value_shape(value) for name, value in input_dict_ort_values.items()}
        run = self._session.run_with_ort_values
        return self._tagged_run(run, output_names, input_dict_ort_values, run_options, shapes, _ort_value_signature)

    def _tagged_run(self, run, output_names, feeds: Mapping[str, Any], run_options, shapes, signature) -> list:
        """``run(output_names, feeds, options)`` (ONNX Runtime's) tagged for its report with the feeds' ``shapes``;
        ``signature(name, value)`` gives a feed's dtype and shape for the :class:`FeedError` of a failed run."""
        import onnxruntime as ort

        slots = self._slots if self._slots is not None and run == self._session.run else None  # "slots" capture
        if slots is not None:
            output_names = slots.requested(output_names)
        with self._tag_lock:
            tag = next(self._tags)
        if run_options is None:  # a RunOptions of its own carries the tag
            options = ort.RunOptions()
            options.add_run_config_entry(RUN_TAG_KEY, str(tag))
        else:  # the caller's own, whose terminate flag ONNX Runtime watches; the tag goes to this thread's next run
            options = run_options
            tag_next_run = native().ndp_ep_tag_next_run
            tag_next_run(tag)
        has_moe = self._has_moe
        if has_moe:
            self.reporter.tag_run(tag, shapes)
        try:
            results = run(output_names, feeds, options)
        except Exception as exc:  # ONNX Runtime refused or failed: one line saying why
            self._check_feeds({name: signature(name, value) for name, value in feeds.items()})
            raise _run_error(exc) from None
        finally:  # its report waits for this (or for all its layers) while other threads' runs are reported
            if options is run_options:
                tag_next_run(0)  # a run refused before it started leaves the tag unused
            if has_moe:
                self._run_finished(tag)
        if not has_moe:
            self.reporter.add_run_without_moe(tag, shapes)
        return results if slots is None else slots.split(tag, results)

    def _check_feeds(self, feeds: Mapping[str, tuple[np.dtype | str, tuple[int, ...]]]) -> None:
        """:class:`FeedError` for the first feed (``name -> (dtype, shape)``) that does not fit the inputs."""
        unknown = sorted(set(feeds) - set(self._inputs))
        if unknown:
            raise FeedError(f"unknown input {unknown[0]!r}; the model's inputs are {sorted(self._inputs)}")
        missing = sorted(set(self._inputs) - set(feeds))
        if missing:
            raise FeedError(f"missing input {missing[0]!r}; the model's inputs are {sorted(self._inputs)}")
        for name, (dtype, shape) in feeds.items():
            spec = self._inputs[name]
            expected = _ORT_TYPES.get(spec.type)
            if expected is not None and dtype != expected:
                got = dtype.name if isinstance(dtype, np.dtype) else dtype
                if isinstance(dtype, np.dtype) and dtype.newbyteorder("=") == expected:  # same type, other order
                    order = "big" if dtype.byteorder == ">" else "little"
                    raise FeedError(
                        f"input {name!r} must be {np.dtype(expected).name} in this machine's byte order, got "
                        f"{order}-endian {got} ({dtype.str!r}): convert it with .astype({np.dtype(expected).str!r})"
                    )
                raise FeedError(f"input {name!r} must be {np.dtype(expected).name}, got {got}")
            if len(spec.shape) != len(shape):
                raise FeedError(f"input {name!r} must have rank {len(spec.shape)} {spec.shape}, got shape {shape}")
            for axis, (want, got_dim) in enumerate(zip(spec.shape, shape, strict=True)):
                if isinstance(want, int) and want != got_dim:
                    raise FeedError(f"input {name!r} dimension {axis} must be {want}, got shape {shape}")

    # -- reports -----------------------------------------------------------------------------------------
    @property
    def reports(self) -> list[RunReport]:
        """The newest reports (at most ``report_ring``), in run order."""
        return self.reporter.reports

    @property
    def last_report(self) -> RunReport | None:
        return self.reporter.last_report

    @property
    def simulator(self):
        """The session's :class:`hw_model.simulator.MoESimulator` with every run so far simulated (None without
        MoE layers): its ``summary()`` holds the counters since the session started."""
        self.reporter.reports  # noqa: B018 - simulates the runs not yet seen
        return self.reporter.simulator

    def end_profiling(self) -> str:
        """ONNX Runtime's ``end_profiling``, the runs' simulated spans added to its profile (ndp_ep/profiling.py)."""
        path = self._session.end_profiling()
        if path and self._has_moe:
            add_simulated_tracks(path, self.reporter.reports)
        return path

    @property
    def pre_gating(self):
        """The :class:`ndp_ep.pregating.PreGating` of ``pre_gating=True``: its predictors (a reason for each layer
        without one) and every run's hits so far (``.cumulative``, ``.rate``); None when off."""
        return self._slots.predictor if self._slots is not None else None

    def routing_trace(self):
        """The :class:`hw_model.routing_trace.CapturedTrace` of every run so far (:mod:`ndp_ep.routing`)."""
        return reporter_trace(self.reporter, source="ndp_ep.InferenceSession")

    @property
    def aggregates(self):
        """Running totals over every run of the session (:class:`ndp_ep.reporter.Aggregates`)."""
        self.reporter.reports  # noqa: B018 - brings the totals up to date
        return self.reporter.aggregates

    def _non_expert_weight_bytes(self, converted) -> float:
        from ndp_ep.reporter import non_expert_weight_bytes

        return non_expert_weight_bytes(converted, _claim(converted), self.dtype)


class _SessionCreation:
    """``onnxruntime.InferenceSession(model, options, **kwargs)`` built on a thread of its own (ONNX Runtime
    releases the GIL while it loads, partitions and compiles the model); :meth:`result` waits for it."""

    def __init__(self, model: str | bytes, options, kwargs: dict) -> None:
        self._outcome: list = []
        self._thread = threading.Thread(target=self._create, args=(model, options, kwargs), daemon=True)
        self._thread.start()

    def _create(self, model: str | bytes, options, kwargs: dict) -> None:
        import onnxruntime as ort

        try:
            self._outcome.append(ort.InferenceSession(model, options, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the creating thread by result()
            self._outcome.append(exc)

    def wait(self) -> None:
        self._thread.join()

    def result(self):
        """The session; ONNX Runtime's refusal as a one-line :class:`ModelLoadError`."""
        self.wait()
        outcome = self._outcome[0]
        if isinstance(outcome, BaseException):  # ORT's own exception types: one line naming the model problem
            raise ModelLoadError(f"onnxruntime could not create the session: {_first_line(outcome)}") from None
        return outcome


def _check_mapping(feeds: object) -> None:
    if type(feeds) is not dict and not isinstance(feeds, Mapping):
        raise FeedError(f"feeds must be a mapping of input name to array, got {type(feeds).__name__}")


def _array_signature(name: str, value: Any) -> tuple[np.dtype, tuple[int, ...]]:
    array = np.asarray(value)
    return array.dtype, array.shape


def _ort_value_shape(value: Any) -> tuple[int, ...]:
    """An ``OrtValue`` feed's shape for its run's report (anything else is refused by the run: no shape)."""
    shape = getattr(value, "shape", None)
    is_tensor = getattr(value, "is_tensor", None)
    return tuple(shape()) if callable(shape) and callable(is_tensor) and is_tensor() else ()


def _ort_value_signature(name: str, value: Any) -> tuple[np.dtype | str, tuple[int, ...]]:
    """The dtype (ONNX Runtime's type name when numpy has none) and shape of an ``OrtValue`` feed."""
    import onnxruntime as ort

    if not isinstance(value, ort.OrtValue):
        raise FeedError(f"input {name!r} must be an onnxruntime.OrtValue, got {type(value).__name__}")
    ort_type = value.data_type()
    dtype = _ORT_TYPES.get(ort_type)
    shape = tuple(value.shape()) if value.is_tensor() else ()  # a sequence or map: its type is refused first
    return (np.dtype(dtype) if dtype is not None else ort_type), shape


def _run_error(exc: BaseException) -> RunError:
    text = " ".join(str(exc).split())
    return RunError(f"the model failed while running: {text if len(text) <= 300 else text[:297] + '...'}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    if "ShardedMoEExperts" in line and "registered" in line:
        line += f" ({REGISTER_HINT})"
    return line


def _claim(model):
    with graph_pass_errors():
        return claim(model)


def _skip_notes(report) -> tuple[str, ...]:
    return tuple(
        f"MoE block at {skip.where} was not converted ({skip.reason}): it runs as dense ops, costed on the GPU"
        for skip in report.skipped
    )


def _convert(proto, shards: int, strict: bool, base_dir):
    """``proto`` converted in memory; it was checked by :func:`_load` (with its directory) and
    :func:`_finish_checks`, not again here."""
    from graph_passes.convert import convert
    from graph_passes.rewrite import materialize_with_store

    with graph_pass_errors():
        rewritten, report = convert(proto, shards=shards, strict=strict, base_dir=base_dir, check=False)
    return materialize_with_store(rewritten), report


def _serialize(proto, base_dir) -> bytes:
    """The model with its external weights inline, read only from files inside its folder."""
    from graph_passes.model_io import load_external_data

    if base_dir is not None:
        with graph_pass_errors():
            load_external_data(proto, base_dir)
    return proto.SerializeToString()


def _check_requested_providers(providers: Sequence[Any] | None, provider_options: Sequence[Any] | None) -> None:
    """:class:`NdpEpError` for options given to ``NdpExecutionProvider`` in ``providers`` / ``provider_options``
    (the session takes ``hw``, ``ndp_units``, ``policy``... as keyword arguments: silently ignoring them would
    report other hardware); a warning naming the requested providers the session does not use (it runs on the
    NDP provider and ONNX Runtime's CPU one), as ONNX Runtime warns about a provider it does not have."""
    providers = list(providers or [])
    names = [p[0] if isinstance(p, tuple) and p else p for p in providers]
    given = [p[1] for p in providers if isinstance(p, tuple) and len(p) > 1 and p[0] == EP_NAME]
    given += [o for name, o in zip(names, provider_options or [], strict=False) if name == EP_NAME]
    if any(given):
        raise NdpEpError(
            f"options for {EP_NAME} in providers/provider_options are not used by ndp_ep.InferenceSession: give "
            "hw=, ndp_units=, policy=, dtype= as keyword arguments"
        )
    ignored = [str(name) for name in names if name not in (EP_NAME, "CPUExecutionProvider")]
    if ignored:
        import warnings

        warnings.warn(
            f"ndp_ep.InferenceSession runs on {EP_NAME} and CPUExecutionProvider; ignoring {', '.join(ignored)}",
            UserWarning,
            stacklevel=3,
        )


def _check_input_shapes(shapes) -> None:
    """:class:`NdpEpError` unless ``shapes`` is None or maps input names to sequences of non-negative ints."""
    if shapes is None:
        return
    if not isinstance(shapes, Mapping):
        raise NdpEpError(f"input_shapes must map input names to shapes, got {type(shapes).__name__}")
    for name, shape in shapes.items():
        dims = list(shape) if isinstance(shape, Sequence) and not isinstance(shape, str | bytes) else None
        bad = dims is None or any(
            isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 0 or d > 2**62 for d in dims
        )
        if not isinstance(name, str) or bad:
            raise NdpEpError(f"input_shapes[{name!r}] must be a sequence of non-negative integers, got {shape!r}"[:300])


def _check_no_provider_added(options) -> None:
    """:class:`NdpEpError` for options that already carry this provider (``ndp_ep.session_options()``), whose
    ``hw``, ``ndp_units``... the session would silently ignore; a warning for other providers added to them, which
    the copy (:func:`copy_session_options`) does not keep. Before onnxruntime 1.24 options cannot tell."""
    if options is None:
        return
    import onnxruntime as ort

    if not isinstance(options, ort.SessionOptions):
        raise NdpEpError(f"sess_options must be an onnxruntime.SessionOptions or None, got {type(options).__name__}")
    has_providers = getattr(options, "has_providers", None)
    if has_providers is None or not has_providers():
        return
    if config_entry(options, OPTION_PREFIX + SESSION_KEY_OPTION) is not None:
        raise NdpEpError(
            f"sess_options already has {EP_NAME} added (by ndp_ep.session_options()): ndp_ep.InferenceSession adds it "
            "itself; pass a SessionOptions without it and give hw=, ndp_units=, policy=, dtype= as keyword arguments"
        )
    import warnings

    warnings.warn(
        f"ndp_ep.InferenceSession runs on {EP_NAME} and CPUExecutionProvider; the providers added to sess_options "
        "are not used",
        UserWarning,
        stacklevel=3,
    )


def _load(source) -> tuple[Any, Path | None, Path | None]:
    """The model (without external weight bytes), the directory of its data, and its path when a file.

    Everything goes through the graph passes' loader and checks (:mod:`graph_passes.model_check`: structure,
    tensor headers, external data only inside the model's folder, an opset ONNX Runtime loads, converted
    nodes that obey the op contract) before any work, except the two checks that need onnx's schema registry
    (about 10 ms to build) or ONNX Runtime's operators, :func:`_finish_checks`: a converted model gets them
    while ONNX Runtime builds its session (which is dropped if they fail), an unconverted one before it is
    converted. Their errors still come first where they came first: when the op contract check fails here,
    they run before its error is raised.
    """
    from graph_passes.errors import InvalidModelError
    from graph_passes.model_check import check_converted_nodes, check_model
    from graph_passes.model_io import load_model

    source = model_source(source)
    with graph_pass_errors():
        model, base_dir = load_model(source, check=False)
        check_model(model, base_dir, schemas=False)
        try:
            check_converted_nodes(model)
        except InvalidModelError:
            _finish_checks(model)  # an error they find comes first, as when they ran before
            raise
    return model, base_dir, (Path(source) if isinstance(source, (str, Path)) else None)


def model_source(source: Any) -> str | Path | onnx.ModelProto:
    """A model argument of the API as the graph passes' loader takes it: a path as given, serialized bytes parsed
    into an ``onnx.ModelProto``; bytes that are not ONNX and any other type raise :class:`ModelLoadError`."""
    import onnx

    if isinstance(source, (bytes, bytearray, memoryview)):
        try:
            source = onnx.load_from_string(bytes(source))
        except Exception as exc:
            raise ModelLoadError(f"the given bytes are not an ONNX model ({type(exc).__name__})") from None
        if not source.graph.node and not source.graph.output:
            raise ModelLoadError("the given bytes are not an ONNX model (no graph)")
    if not isinstance(source, (str, Path, onnx.ModelProto)):
        raise ModelLoadError(f"expected a model path, bytes or onnx.ModelProto, got {type(source).__name__}")
    return source


def _finish_checks(model) -> None:
    """The checks :func:`_load` leaves out, in their order: ``onnx.checker``'s structure and schema check, then
    every operator known to ONNX Runtime (:func:`graph_passes.model_check.check_runnable`)."""
    from graph_passes.model_check import check_runnable, check_schemas

    with graph_pass_errors():
        check_schemas(model)
        check_runnable(model)


__all__ = ["InferenceSession", "PROVIDER_NAME", "OPTION_PREFIX", "one_run_session_options"]

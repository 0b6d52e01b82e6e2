"""ONNX Runtime GenAI model folders on the provider: their ``genai_config.json``, checked; the input shapes of each
generation step; and :class:`GenerationReports`, the simulated-latency reports of a generation that GenAI runs in
its own loop (``ndp-ep generate`` is one such loop).

    import onnxruntime_genai as og, ndp_ep

    reports = ndp_ep.GenerationReports("model_dir", hw="paper", ndp_units=4, prompt_tokens=len(prompt))
    config = og.Config("model_dir")           # a folder converted by ndp-ep convert
    reports.add_provider(config)              # the library registered with GenAI, the provider appended
    model = og.Model(config)
    ...                                       # GenAI's generator loop
    prefill, *decode = reports.reports        # read while the model is alive (its routing lives with it)
    reports.new_generation()                  # before the next og.Generator: its prompt starts an empty KV cache
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path, PureWindowsPath
from typing import TYPE_CHECKING, NoReturn

from ndp_ep.reporter import DEFAULT_REPORT_RING

if TYPE_CHECKING:
    from hw_model.hardware import SystemSpec
    from hw_model.settings import SimulationSettings
    from ndp_ep.report import RunReport

GENAI_CONFIG = "genai_config.json"
# routing records kept while no report is read: a whole 512 + 512 generation of a 48-layer model, and more
DEFAULT_ROUTING_CAPACITY = 1 << 20


def read_config(folder: Path) -> dict:
    """``folder``'s ``genai_config.json``, every value ndp-ep reads checked: :class:`ModelLoadError`
    naming the file and the field otherwise (a bad value would fail later as a traceback, or read outside the
    folder: a decoder ``filename`` must be a relative path inside it, as GenAI requires)."""
    from ndp_ep.errors import ModelLoadError
    from ndp_io.guard import inside_folder
    from ndp_io.parsing import read_json

    path = folder / GENAI_CONFIG
    if not path.is_file():
        raise ModelLoadError(f"{folder} is not an ONNX Runtime GenAI model folder (no {GENAI_CONFIG})")
    if inside_folder(folder, path) is None:
        raise ModelLoadError(f"{path} is a link out of the model folder; not read")
    config = read_json(path, ModelLoadError)  # depth- and size-bounded (ndp_io/limits.py)

    def refuse(field: str, value: object, what: str) -> NoReturn:
        shown = json.dumps(value) if not isinstance(value, str) else repr(value)
        shown = shown if len(shown) <= 200 else shown[:197] + "..."  # a path is shown whole; a pasted blob is not
        raise ModelLoadError(f"{path}: {field} must be {what}, got {shown}")

    def mapping(parent: dict, key: str, field: str, required: bool = True) -> dict:
        value = parent.get(key)
        if value is None and not required:
            return {}
        if key not in parent:
            raise ModelLoadError(f"{path}: {field} is missing")
        if not isinstance(value, dict):
            refuse(field, value, "an object")
        return value

    def integer(parent: dict, key: str, field: str, minimum: int) -> None:
        value = parent.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < minimum):
            refuse(field, value, "a positive integer" if minimum == 1 else f"an integer >= {minimum}")

    if not isinstance(config, dict):
        raise ModelLoadError(f"{path}: not a GenAI config (not a JSON object)")
    model = mapping(config, "model", "model")
    decoder = mapping(model, "decoder", "model.decoder")
    integer(model, "context_length", "model.context_length", 1)
    integer(model, "vocab_size", "model.vocab_size", 1)
    integer(decoder, "head_size", "model.decoder.head_size", 1)
    window = mapping(decoder, "sliding_window", "model.decoder.sliding_window", required=False)
    integer(window, "window_size", "model.decoder.sliding_window.window_size", 1)
    integer(window, "cache_slack", "model.decoder.sliding_window.cache_slack", 0)
    names = mapping(decoder, "inputs", "model.decoder.inputs", required=False)
    for key in ("past_key_names", "past_value_names"):
        if key in names and not isinstance(names[key], str):
            refuse(f"model.decoder.inputs.{key}", names[key], "a string")
    filename = decoder.get("filename")
    if "filename" not in decoder:
        raise ModelLoadError(f"{path}: model.decoder.filename is missing")
    if not isinstance(filename, str) or not filename.strip() or "\0" in filename:
        refuse("model.decoder.filename", filename, "the decoder's file name")
    parts = filename.replace("\\", "/").split("/")
    if filename.startswith(("/", "\\")) or PureWindowsPath(filename).drive or ".." in parts:
        refuse("model.decoder.filename", filename, "a path inside the model folder (relative, no '..')")
    if not (folder / filename).is_file():
        raise ModelLoadError(f"{path}: model.decoder.filename names {filename}, which is not a file in {folder}")
    if inside_folder(folder, folder / filename) is None:
        raise ModelLoadError(f"{path}: model.decoder.filename names {filename}, a link out of the model folder")
    return config


def decoder_path(folder: Path, config: dict) -> Path:
    return folder / config["model"]["decoder"]["filename"]


def load_decoder(folder: Path, config: dict, check: bool = True):
    """The decoder's graph (no weight bytes), checked as ``ndp-ep run`` checks a model: structure, tensor
    headers, external data inside its folder (:func:`graph_passes.model_io.load_model`)."""
    from graph_passes.model_io import load_model
    from ndp_ep.errors import graph_pass_errors

    with graph_pass_errors():
        model, _ = load_model(decoder_path(folder, config), check=check)
    return model


def is_converted(model) -> bool:
    """Whether a decoder graph has nodes the provider runs (converted by ``ndp-ep convert``)."""
    from ndp_ep.partition import is_ndp_supported

    return any(is_ndp_supported(n) for n in model.graph.node)


def register_with_genai(og) -> None:
    """The provider's library registered with ONNX Runtime and with GenAI (``og``), once per process."""
    from ndp_ep.ep import EP_NAME, get_library_path, register

    register()
    try:
        og.register_execution_provider_library(EP_NAME, get_library_path())
    except RuntimeError as exc:  # by an earlier generation in this process: GenAI keeps it for the process
        if "already registered" not in str(exc):
            raise


def step_shapes(model, config: dict) -> Callable[[int, int], dict[str, tuple[int, ...]]]:
    """``shapes(tokens, past)``: the input shapes of a generation step of ``tokens`` new tokens after ``past`` tokens
    (the prefill: the prompt's tokens after 0), from the decoder's symbolic input dims, as
    :func:`graph_passes.feeds.random_feeds` names them: batch 1; a past length (``past_sequence_length``) the
    tokens before the step, the total length those and the step's; a window cache (``past_sliding_length``) its
    capacity, the config's window plus its cache slack; a KV cache's last dim the config's head size; any other
    the step's tokens."""
    import re

    from graph_passes.feeds import BATCH_DIM_NAMES, PAST_LENGTH_DIMS, SLIDING_DIMS, TOTAL_LENGTH_DIMS

    decoder = config["model"]["decoder"]
    window = decoder.get("sliding_window") or {}
    capacity = int(window.get("window_size", 0)) + int(window.get("cache_slack", 0))
    names = decoder.get("inputs", {})
    patterns = [names[key] for key in ("past_key_names", "past_value_names") if key in names]  # "past.%d.key"
    cache = re.compile("|".join(re.escape(p).replace("%d", r"\d+") for p in patterns)) if patterns else None
    inputs = [
        (
            i.name,
            [d.dim_value if d.HasField("dim_value") else d.dim_param for d in i.type.tensor_type.shape.dim],
            bool(cache and cache.fullmatch(i.name)),
        )
        for i in model.graph.input
    ]
    head_size = decoder.get("head_size")

    def shapes(tokens: int, past: int) -> dict[str, tuple[int, ...]]:
        sizes = {
            **dict.fromkeys(BATCH_DIM_NAMES, 1),
            **dict.fromkeys(PAST_LENGTH_DIMS, past),
            **dict.fromkeys(SLIDING_DIMS, capacity or past),
            **dict.fromkeys(TOTAL_LENGTH_DIMS, past + tokens),
        }
        result = {}
        for name, dims, is_cache in inputs:
            shape = []
            for position, d in enumerate(dims):
                if isinstance(d, int) and d > 0:
                    shape.append(d)
                elif str(d).lower() in sizes:
                    shape.append(sizes[str(d).lower()])
                elif is_cache and position == len(dims) - 1 and isinstance(head_size, int):
                    shape.append(head_size)
                else:
                    shape.append(tokens)
            result[name] = tuple(shape)
        return result

    return shapes


class GenerationReports:
    """The reports of a generation that ONNX Runtime GenAI runs on the provider (see the module docstring).

    ``model_dir``: a GenAI folder whose decoder ``ndp-ep convert`` converted; ``settings`` (a
    :class:`hw_model.SimulationSettings`) or ``hw`` (a preset, a TOML file or a :class:`SystemSpec`), ``ndp_units``,
    ``policy`` as for :class:`ndp_ep.InferenceSession`. With ``prompt_tokens``
    (a generation of batch 1 whose prompt has that many tokens) each run's non-expert work is costed at its shapes:
    its tokens (from its routing) after the generation's tokens before it, so tokens appended to a running
    generation are costed too; a generation whose first run is not ``prompt_tokens`` long (another prompt, or a
    batch larger than 1) has that run's non-expert work not costed, and the report says so. Before a new generation
    (a new ``og.Generator``) call :meth:`new_generation`. Without ``prompt_tokens``, reports cost the expert side
    only and say so. ``report_ring``: reports kept (default: every run of one generation, the config's
    context length + 1, at least 256). ``routing_capacity``: routing records kept while no report is read. Bad
    input raises :class:`ndp_ep.ModelLoadError` (the folder, its config, its decoder), :class:`ndp_ep.NdpEpError`
    (an unconverted decoder, a bad option), :class:`hw_model.SettingsError` or :class:`hw_model.HardwareConfigError`.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        settings: SimulationSettings | None = None,
        hw: str | Path | SystemSpec | None = None,
        ndp_units: int | None = None,
        policy: str | None = None,
        prompt_tokens: int | None = None,
        report_ring: int | None = None,
        routing_capacity: int = DEFAULT_ROUTING_CAPACITY,
    ) -> None:
        from ndp_ep.ep import settings_of
        from ndp_ep.errors import NdpEpError

        settings = settings_of(settings, hw=hw, ndp_units=ndp_units, policy=policy)
        folder = Path(model_dir)
        config = read_config(folder)
        decoder = load_decoder(folder, config)
        if not is_converted(decoder):
            raise NdpEpError(f"{decoder_path(folder, config)} is not converted: run ndp-ep convert on it first")
        self._set_up(decoder, config, settings, prompt_tokens, report_ring, routing_capacity)

    @classmethod
    def of_decoder(
        cls,
        decoder,
        config: dict,
        settings: SimulationSettings,
        *,
        prompt_tokens: int | None = None,
        report_ring: int | None = None,
        routing_capacity: int = DEFAULT_ROUTING_CAPACITY,
    ) -> GenerationReports:
        """The reports of a converted decoder graph whose folder's config was read already (:func:`read_config`),
        simulated under ``settings``."""
        reports = cls.__new__(cls)
        reports._set_up(decoder, config, settings, prompt_tokens, report_ring, routing_capacity)
        return reports

    def _set_up(
        self,
        decoder,
        config: dict,
        settings: SimulationSettings,
        prompt_tokens: int | None,
        report_ring: int | None,
        routing_capacity: int,
    ) -> None:
        from ndp_ep.ep import check_positive, new_session_key
        from ndp_ep.reporter import SessionReporter

        check_positive("prompt_tokens", prompt_tokens)
        check_positive("routing_capacity", routing_capacity)
        self.settings = settings
        self.system = settings.system
        self.session_key = new_session_key()
        self._routing_capacity = routing_capacity
        if report_ring is None:  # every run of one generation: a prefill and at most context_length - 1 steps
            report_ring = max(int(config["model"].get("context_length") or 0) + 1, DEFAULT_REPORT_RING)
        self._prompt_tokens = prompt_tokens
        self._past_tokens = 0  # the tokens of this generation's runs reported so far
        self._step_shapes = step_shapes(decoder, config)
        self.reporter = SessionReporter(
            decoder,
            settings,
            self.session_key,
            report_ring=report_ring,
            untagged_shapes=self._run_shapes,
        )

    def _run_shapes(self, tokens: int) -> dict[str, tuple[int, ...]] | None:
        """The input shapes of the generation's next run, of ``tokens`` tokens (the reporter asks in run order), or
        None without a prompt length or for a first run that is not the prompt declared (its shapes are unknown)."""
        past = self._past_tokens
        self._past_tokens += tokens
        if self._prompt_tokens is None or (past == 0 and tokens != self._prompt_tokens):
            return None
        return self._step_shapes(tokens, past)

    def new_generation(self, prompt_tokens: int | None = None) -> None:
        """The runs from now on belong to a new generation (a new ``og.Generator``): its first run is its prompt,
        of ``prompt_tokens`` tokens (default: as the previous generation's; given, it also starts costing the
        non-expert work of reports made without it), with an empty KV cache. The runs so
        far are reported first (as :attr:`reports` would), so they keep the generation they belong to."""
        from ndp_ep.ep import check_positive

        check_positive("prompt_tokens", prompt_tokens)
        self.reporter.last_report  # noqa: B018 -- reports the runs so far, in the generation that ends here
        self._past_tokens = 0
        if prompt_tokens is not None:
            self._prompt_tokens = prompt_tokens

    @property
    def provider_options(self) -> dict[str, str]:
        """The provider options GenAI's config needs (``set_provider_option``): the library's own, the session key
        among them (the reports take their settings from this object)."""
        return {
            "session_key": self.session_key,
            "routing_capacity": str(self._routing_capacity),
        }

    def add_provider(self, config) -> None:
        """Register the library with GenAI (once per process) and make the provider, with :attr:`provider_options`,
        ``config``'s only one (an ``onnxruntime_genai.Config``: the providers its genai_config.json lists, such as a
        model builder's ``cuda``, are cleared first; ONNX Runtime's CPU provider runs the other nodes)."""
        import onnxruntime_genai as og

        from ndp_ep.ep import EP_NAME

        register_with_genai(og)
        config.clear_providers()
        config.append_provider(EP_NAME)
        for key, value in self.provider_options.items():
            config.set_provider_option(EP_NAME, key, value)

    @property
    def reports(self) -> list[RunReport]:
        """The newest reports (at most ``report_ring``), one per decoder run in order: the prefill, then each
        decode step. Read them while GenAI's model is alive: the routing not read yet goes with it."""
        return self.reporter.reports

    @property
    def last_report(self) -> RunReport | None:
        return self.reporter.last_report

    def routing_trace(self, new_tokens: int | None = None):
        """The routing trace of the runs so far (:mod:`ndp_ep.routing`): the prefill, then each decode step. Capture
        starts at the first call if no report was read before it (call :meth:`start_routing_capture` first
        otherwise); read it while GenAI's model is alive."""
        from ndp_ep.routing import reporter_trace

        prompt = self._prompt_tokens
        return reporter_trace(self.reporter, prompt_tokens=prompt, new_tokens=new_tokens, source="GenerationReports")

    def start_routing_capture(self) -> None:
        """Record each run's routing from now on (before any report is read), for :meth:`routing_trace`."""
        from ndp_ep.routing import start_capture

        start_capture(self.reporter)


__all__ = ["GENAI_CONFIG", "GenerationReports", "read_config", "load_decoder", "step_shapes"]

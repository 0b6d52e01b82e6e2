"""The native execution provider for plain ONNX Runtime: find, register and select ``NdpExecutionProvider``.

Following the plugin-EP packages' convention (onnxruntime-ep-*, onnxruntime-ggml)::

    import onnxruntime as ort, ndp_ep
    so = ndp_ep.session_options(hw="paper", ndp_units=4)      # or: so.add_provider_for_devices(ndp_ep.devices(), {...})
    sess = ort.InferenceSession("model.ndp.onnx", so)
    sess.run(None, feeds)
    print(ndp_ep.last_report(sess).format_text())

The library (``libndp_ep.so``, built from ``native/`` by ``pip install .``) exports ONNX Runtime's plugin-EP
entry points plus a few C functions this module reads the routing capture through (``ctypes`` on the library
ONNX Runtime already loaded, so both share its globals). EP options arrive in the library as session config
entries ``ep.ndpexecutionprovider.<key>``; ``session_key`` names the session's routing log, ``routing_capacity``
bounds it (records kept when nobody reads them), ``record_routing=0`` turns capture off. :func:`session_options`
checks them first, by the rules the reports read them with (:func:`parse_ep_options`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ndp_ep.errors import NdpEpError

if TYPE_CHECKING:
    from hw_model.hardware import SystemSpec
    from hw_model.settings import SimulationSettings

EP_NAME = "NdpExecutionProvider"
OPTION_PREFIX = "ep.ndpexecutionprovider."
RUN_TAG_KEY = OPTION_PREFIX + "run_tag"
SESSION_KEY_OPTION = "session_key"
# the options a report is simulated with (read back from a plain session's config entries), then the library's own
REPORT_OPTION_KEYS = ("hw", "ndp_units", "policy", "dtype")
EP_OPTION_KEYS = (*REPORT_OPTION_KEYS, SESSION_KEY_OPTION, "routing_capacity", "record_routing")
LIBRARY_ENV = "NDP_EP_LIBRARY"
LIBRARY_NAME = "libndp_ep.so"
MIN_ORT_VERSION = (1, 23, 1)
SCHEMA_API_VERSION = 24  # from this ORT API on, the EP factory itself registers the op's schema
REGISTER_HINT = (
    "ndp_ep::ShardedMoEExperts runs only on the ndp-ep execution provider: install ndp-ep and create the session "
    "with ndp_ep.InferenceSession(model) or ndp_ep.session_options() (see docs/provider.md)"
)

_lock = threading.Lock()
_registered_path: str | None = None
_native: ctypes.CDLL | None = None


class LibraryNotFoundError(NdpEpError):
    """The native provider library is not built or cannot be loaded into this ONNX Runtime."""


def get_ep_name() -> str:
    """The execution provider's name, as ONNX Runtime lists it."""
    return EP_NAME


def _library_candidates() -> Iterator[Path]:
    """Where the library may be, in order of preference; the installed distribution is looked up (a scan of
    ``sys.path``) only when the package's own ``lib/`` and an in-tree build have none."""
    here = Path(__file__).resolve().parent
    yield here / "lib" / LIBRARY_NAME
    yield here.parent / "build" / "native" / LIBRARY_NAME
    try:  # the installed wheel's copy, when a source checkout's ndp_ep/ shadows the installed package
        from importlib.metadata import PackageNotFoundError, distribution

        installed = Path(str(distribution("ndp-ep").locate_file(f"ndp_ep/lib/{LIBRARY_NAME}")))
    except (ImportError, PackageNotFoundError):
        return
    yield installed


def get_library_path() -> str:
    """Path of ``libndp_ep.so``: ``$NDP_EP_LIBRARY``, else the package's ``lib/``, an in-tree ``build/native/``,
    or the installed distribution's copy."""
    override = os.environ.get(LIBRARY_ENV)
    if override:
        if not Path(override).is_file():
            raise LibraryNotFoundError(f"{LIBRARY_ENV}={override} is not a file")
        return str(Path(override).resolve())
    for candidate in _library_candidates():
        if candidate.is_file():
            return str(candidate)
    raise LibraryNotFoundError(
        f"{LIBRARY_NAME} not found (install ndp-ep with `pip install .`, or build it in the source tree with "
        "`cmake -S . -B build/cmake && cmake --build build/cmake`, or set NDP_EP_LIBRARY)"
    )


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def register() -> str:
    """Register the library with ONNX Runtime once per process (idempotent); returns its path."""
    global _registered_path
    import onnxruntime as ort

    with _lock:
        if _registered_path is not None:
            return _registered_path
        if _version_tuple(ort.__version__) < MIN_ORT_VERSION:
            raise LibraryNotFoundError(
                f"onnxruntime {ort.__version__} cannot run the ndp-ep provider (needs >= 1.23.1: older releases "
                "lack plugin providers or put copy nodes around them)"
            )
        path = get_library_path()
        try:
            ort.register_execution_provider_library(EP_NAME, path)
        except Exception as exc:  # ORT raises its own Fail/InvalidArgument types
            if "already" not in str(exc).lower():
                raise LibraryNotFoundError(f"onnxruntime could not load {path}: {exc}") from None
        _registered_path = path
        return path


def warm_up() -> threading.Thread:
    """ONNX Runtime's one-time work, started on a daemon thread (returned): registering the library
    (:func:`register`) and building the process's first session, of a one-node model
    (:data:`graph_passes.runtime_probe.WARM_UP_MODEL`). About 5 ms, nearly all of it in ONNX Runtime without
    the GIL, that the first session built (the opset probe of :mod:`graph_passes.model_check`) and the first
    :func:`session_options` would otherwise pay on the calling thread; a program starts it before it imports
    onnx. A failure here is left to whoever registers the library next, which raises it as it would have."""
    from graph_passes.runtime_probe import WARM_UP_MODEL, runtime_builds

    def work() -> None:
        with contextlib.suppress(Exception):  # raised again, to the caller, by the next register()
            register()
        runtime_builds(WARM_UP_MODEL)

    thread = threading.Thread(target=work, name="ndp-ep warm-up", daemon=True)
    thread.start()
    return thread


def devices() -> list:
    """The ``OrtEpDevice`` s of this provider (one: the host CPU), for ``add_provider_for_devices``."""
    import onnxruntime as ort

    register()
    found = [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]
    if not found:
        raise LibraryNotFoundError(f"onnxruntime lists no {EP_NAME} device after registering {get_library_path()}")
    return found


def native() -> ctypes.CDLL:
    """The library's C interface (the handle ONNX Runtime opened, after :func:`register`)."""
    global _native
    if _native is None:
        lib = ctypes.CDLL(register())
        i64 = ctypes.c_int64
        lib.ndp_ep_routing_take.argtypes = [ctypes.POINTER(_RoutingTake)]
        lib.ndp_ep_routing_take.restype = i64
        lib.ndp_ep_routing_layers.argtypes = [ctypes.c_char_p, ctypes.c_char_p, i64]
        lib.ndp_ep_routing_layers.restype = i64
        lib.ndp_ep_tag_next_run.argtypes = [i64]
        lib.ndp_ep_tag_next_run.restype = None
        lib.ndp_ep_factory_api_version.restype = ctypes.c_int
        lib.ndp_ep_version.restype = ctypes.c_char_p
        _native = lib
    return _native


def new_session_key() -> str:
    """A fresh key naming one session's routing log: 32 random hex digits (as ``uuid4().hex``, without importing
    :mod:`uuid`: about half a millisecond of every ``ndp-ep run``)."""
    return os.urandom(16).hex()


def session_options(options=None, **ep_options):
    """``options`` (or a new ``onnxruntime.SessionOptions``) with the provider added and ``ep_options`` as its
    options (``hw``, ``ndp_units``, ``policy``, ``routing_capacity``...; values are passed as strings).

    The options are checked first (:func:`parse_ep_options`), so a bad one fails here rather than at the first
    report. A ``session_key`` is added when absent, so :func:`ndp_ep.last_report` can find the session's routing.
    On ONNX Runtime 1.23 the op's schema is registered here too (later versions take it from the provider).
    """
    values = _option_texts(ep_options)
    parse_ep_options(values)
    return add_provider(options, values)


def add_provider(options, ep_options: Mapping[str, object]):
    """:func:`session_options` without the check, for a caller that has checked its options itself
    (:class:`ndp_ep.InferenceSession`, whose ``hw`` may be a :class:`SystemSpec` loaded already)."""
    import onnxruntime as ort

    so = ort.SessionOptions() if options is None else options
    values = _option_texts(ep_options)
    values.setdefault(SESSION_KEY_OPTION, new_session_key())
    if native().ndp_ep_factory_api_version() < SCHEMA_API_VERSION:
        so.register_custom_ops_library(get_library_path())
    so.add_provider_for_devices(devices(), values)
    return so


def _option_texts(ep_options: Mapping[str, object]) -> dict[str, str]:
    """Provider options as ONNX Runtime stores them: text, those set to None left out."""
    return {str(k): str(v) for k, v in ep_options.items() if v is not None}


def parse_ep_options(values: Mapping[str, str]) -> SimulationSettings:
    """The provider options ``values`` (text, as ONNX Runtime stores them), checked by the rules the reports read
    them with: one home for :func:`session_options` (before the session exists) and for a plain session's reporter
    (:func:`ndp_ep.reporter.reporter_for`, from the session's config entries).

    Returns the report options (``hw``, default the default hardware, ``ndp_units``, ``policy``, ``dtype``) as one
    run's :class:`hw_model.settings.SimulationSettings`, which checks them (:class:`hw_model.SettingsError`; a bad
    ``hw`` or ``ndp_units`` names its EP option). The library's own are checked here: :class:`NdpEpError` for an
    unknown key (naming the known ones), a ``routing_capacity`` that is not a positive integer, a
    ``record_routing`` other than 0 or 1, or an empty ``session_key``.
    """
    unknown = sorted(set(values) - set(EP_OPTION_KEYS))
    if unknown:
        raise NdpEpError(f"unknown EP option {unknown[0]!r} (known: {', '.join(EP_OPTION_KEYS)})")
    capacity = values.get("routing_capacity")
    if capacity is not None and not _is_positive_integer(capacity):
        raise NdpEpError(f"EP option routing_capacity must be a positive integer, got {capacity!r}")
    if values.get("record_routing", "1") not in ("0", "1"):
        raise NdpEpError(f"EP option record_routing must be 0 or 1, got {values['record_routing']!r}")
    if values.get(SESSION_KEY_OPTION) == "":
        raise NdpEpError(f"EP option {SESSION_KEY_OPTION} must not be empty")
    from ndp_io.limits import MAX_SESSION_KEY_CHARS, limit_note

    if len(values.get(SESSION_KEY_OPTION, "")) > MAX_SESSION_KEY_CHARS:
        raise NdpEpError(
            f"EP option {SESSION_KEY_OPTION} is {len(values[SESSION_KEY_OPTION]):,} characters long "
            f"{limit_note('MAX_SESSION_KEY_CHARS')}"
        )
    from hw_model.errors import HardwareConfigError
    from hw_model.settings import SimulationSettings, check_ndp_units

    given: dict[str, object] = {key: values[key] for key in REPORT_OPTION_KEYS if key in values}
    if "ndp_units" in given:  # text, as ONNX Runtime keeps it: a plain integer is read as one
        text = str(given["ndp_units"])
        number = int(text) if text.isascii() and text.isdigit() else text
        given["ndp_units"] = check_ndp_units(number, "EP option ndp_units")
    try:
        return SimulationSettings(**given)  # type: ignore[arg-type]
    except HardwareConfigError as exc:
        raise HardwareConfigError(f"EP option hw: {exc}") from None


def _is_positive_integer(text: str) -> bool:
    return text.isascii() and text.isdigit() and int(text) > 0


def check_positive(name: str, value: object) -> None:
    """:class:`NdpEpError` naming ``name`` unless ``value`` is None or a positive integer (not a bool)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise NdpEpError(f"{name} must be a positive integer, got {value!r}")


def settings_of(
    settings: SimulationSettings | None = None,
    *,
    hw: str | os.PathLike[str] | SystemSpec | None = None,
    ndp_units: int | None = None,
    policy: str | None = None,
    dtype: str | None = None,
) -> SimulationSettings:
    """The settings an API call names: ``settings`` as given, or built from ``hw`` (default: the default
    hardware), ``ndp_units``, ``policy`` and ``dtype`` (None: the default); both at once is an :class:`NdpEpError`."""
    from hw_model.settings import SimulationSettings

    named = {"hw": hw, "ndp_units": ndp_units, "policy": policy, "dtype": dtype}
    given = {key: value for key, value in named.items() if value is not None}
    if settings is not None:
        if given:
            raise NdpEpError(f"give either settings= or {', '.join(f'{k}=' for k in given)}, not both")
        if not isinstance(settings, SimulationSettings):
            raise NdpEpError(f"settings must be a hw_model.SimulationSettings, got {type(settings).__name__}")
        return settings
    return SimulationSettings(**given)  # type: ignore[arg-type]


def config_entry(options, key: str) -> str | None:
    """The session config entry ``key`` of a SessionOptions as it is, or None when it has none."""
    try:
        return options.get_session_config_entry(key)
    except Exception:  # noqa: BLE001 - ONNX Runtime raises when the entry is absent
        return None


def session_option(options, key: str) -> str | None:
    """The provider option ``key`` of a SessionOptions, or None (also when empty)."""
    return config_entry(options, OPTION_PREFIX + key) or None


ROUTING_META = 4  # values per record the take call writes (native/src/routing_log.h kRoutingMeta)
SHARED_KEY = -3  # what the routing calls return when several live sessions share a key (native/src/routing_log.cc)


class _RoutingTake(ctypes.Structure):
    """``NdpRoutingTake`` of native/src/routing_log.h: what ``ndp_ep_routing_take`` reads and fills."""

    _fields_ = (
        ("key", ctypes.c_char_p),
        ("meta", ctypes.c_void_p),
        ("max_records", ctypes.c_int64),
        ("counts", ctypes.c_void_p),
        ("width", ctypes.c_int64),
        ("dropped", ctypes.c_int64),
    )


class RoutingReader:
    """Reads (and removes) the routing counters the library captured for one session key: per MoE layer
    invocation, how many token slots each expert was routed."""

    BATCH = 256  # records per C call (the buffers are reused)

    def __init__(self, key: str) -> None:
        if not key:
            raise NdpEpError("a session key is needed to read routing")
        self.key = key.encode()
        self._lib = native()
        self._meta = np.empty(ROUTING_META * self.BATCH, np.int64)
        self._meta_view = memoryview(self._meta)  # its tolist is quicker than the array's
        self._request = _RoutingTake(self.key, self._meta.ctypes.data, self.BATCH, None, -1, 0)
        # one argument, built once: the call converts nothing else (the shared function object checks its type)
        self._request_ref = ctypes.pointer(self._request)
        self._take = self._lib["ndp_ep_routing_take"]  # a new function object, without argtypes
        self._take.restype = ctypes.c_int64

    def layer_names(self) -> list[str]:
        size = self._lib.ndp_ep_routing_layers(self.key, None, 0)
        if size == SHARED_KEY:
            raise NdpEpError(self._shared_key_message())
        if size < 0:
            return []
        buffer = ctypes.create_string_buffer(int(size))
        self._lib.ndp_ep_routing_layers(self.key, buffer, size)
        text = buffer.value.decode()
        return text.split("\n") if text else []

    def _shared_key_message(self) -> str:
        return (
            f"several live sessions were created with the session key {self.key.decode()!r}: their routing cannot be "
            "told apart, so none is reported; give each session its own key (ndp_ep.session_options() makes a new "
            "one per call: one call per session)"
        )

    def dropped(self) -> int:
        """Records the log dropped because nobody drained it (it keeps the newest ``routing_capacity``), as of the
        last :meth:`take`."""
        return self._request.dropped

    def take(self, width: int) -> tuple[list[int], list[int], list[int], list[int], np.ndarray]:
        """Every pending record, oldest first: their run ids, layers, tokens and expert token totals (the sum of
        each one's counts; one list each), and their expert counts as the rows of one ``[records, width]`` array
        (zero beyond a layer's experts). That array may be a view of this reader's buffer, valid until the next
        call: copy what is kept."""
        request = self._request
        if width != request.width:
            self._counts = np.empty((self.BATCH, width), np.int32)
            request.counts = self._counts.ctypes.data  # ndarray.ctypes is slow: read once per buffer
            request.width = width
        got = self._take(self._request_ref)
        if 0 <= got < self.BATCH:  # the usual read: one call drains the log
            meta = self._meta_view[: ROUTING_META * got].tolist()
            return _columns(meta, self._counts[:got])
        meta: list[int] = []
        batches: list[np.ndarray] = []
        while got > 0:  # a full batch (more may follow), then the rest
            meta += self._meta_view[: ROUTING_META * got].tolist()
            batches.append(self._counts[:got].copy())
            got = self._take(self._request_ref) if got == self.BATCH else 0
        if got == -2:
            raise NdpEpError(f"a routing record has more experts than the {width} this session's layers have")
        if got == SHARED_KEY:
            raise NdpEpError(self._shared_key_message())
        if not batches:  # -1: no log under this key (the session is gone)
            return [], [], [], [], np.zeros((0, width), np.int32)
        counts = batches[0] if len(batches) == 1 else np.concatenate(batches)
        return _columns(meta, counts)


def _columns(meta: list[int], counts: np.ndarray) -> tuple[list[int], list[int], list[int], list[int], np.ndarray]:
    """The records taken, as :meth:`RoutingReader.take` returns them, from their meta values in a row."""
    m = ROUTING_META
    return meta[0::m], meta[1::m], meta[2::m], meta[3::m], counts

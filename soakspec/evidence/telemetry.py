"""Telemetry: GPU state through NVML and server memory from /proc.

`NvmlSource` wraps a module object with pynvml's function names (default: `import pynvml`,
loaded lazily). If the import or `nvmlInit` fails, `available` is False and `reason` says why;
nothing here raises because a GPU is missing. Raw GPU UUIDs never leave this module: the
inventory carries `uuid_sha256`.

The calls are synchronous and usually quick; the runner samples from trio on a worker thread
it abandons when a call does not return in time (`runner/backend.py sample_telemetry`, then
`NvmlSource.stall`): a wedged driver hangs NVML's calls, and must not hang the run.

CUDA_VISIBLE_DEVICES (soakspec's own; a launched server's from its spec, `NvmlSource.restricted`): integer entries are taken as NVML indices (true when
CUDA_DEVICE_ORDER=PCI_BUS_ID, which servers under test should set); `GPU-...` entries match
UUID prefixes; `MIG-...` entries match the UUID prefixes of the MIG devices of the GPUs in MIG
mode (a server on a slice of an H100 names its slice so). As in CUDA, parsing stops at the
first entry that names no device.

A MIG device is sampled as itself where NVML measures the slice -- its memory used, the memory
of the server's processes on it -- and null where it does not: NVML gives no utilization for a
slice, and a temperature or power reading is the whole GPU's, which summed over a GPU's slices
would count it once a slice. Its inventory entry and samples name the slice (`mig`: its slot
on the GPU, the GPU and compute instance ids), beside the GPU's `index`.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_UNSET: Any = object()
NVML_TEMPERATURE_GPU = 0


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


NVML_DEVICE_MIG_ENABLE = 1  # nvmlDeviceGetMigMode's current mode of a GPU in MIG mode
MAX_MIG_SLOTS = 64  # MIG device slots looked at on one GPU (an H100 has 7)


def visible_indices(spec: str | None, count: int, uuids: list[str],
                    migs: list[tuple[int, int, str]] | tuple[()] = ()) -> list[int | tuple[int, int]]:
    """The devices a CUDA_VISIBLE_DEVICES value selects (None: every GPU): an NVML index for a
    GPU, `(GPU index, slot)` for a MIG device (`migs`: each MIG device's GPU, slot and UUID)."""
    if spec is None:
        return list(range(count))
    out: list[int | tuple[int, int]] = []
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            break
        idx: int | tuple[int, int] | None = None
        if entry.lstrip("-").isdigit():
            n = int(entry)
            idx = n if 0 <= n < count else None
        elif entry.startswith("MIG-"):
            found = [(g, k) for g, k, u in migs if u.startswith(entry)]
            idx = found[0] if len(found) == 1 else None
        else:
            matches = [i for i, u in enumerate(uuids) if u.startswith(entry)]
            idx = matches[0] if len(matches) == 1 else None
        if idx is None:
            break
        if idx not in out:
            out.append(idx)
    return out


class NvmlSource:
    """GPU inventory and samples through an NVML module object (see the module docstring)."""

    def __init__(self, module: Any = None, visible_devices: str | None = _UNSET):
        self._module = module
        self._visible_spec = os.environ.get("CUDA_VISIBLE_DEVICES") if visible_devices is _UNSET else visible_devices
        self._started = False
        self._available = False
        self._reason: str | None = None
        # the selected devices: (GPU index, handle, MIG slot or None)
        self._handles: list[tuple[int, Any, int | None]] = []
        self._all: list[Any] = []  # every device's handle, in NVML's order
        self._uuids: list[str] = []
        self._migs: dict[tuple[int, int], tuple[Any, str]] = {}  # (GPU, slot) -> MIG handle, UUID
        self._owner = True  # a `restricted` view shares its parent's NVML session: never shuts it down
        self._session: dict[str, Any] = {"stalled": None}  # shared with the views: why sampling stopped

    # -- lifecycle --------------------------------------------------------------------------

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        if self._module is None:
            try:
                import pynvml  # noqa: PLC0415 - lazy on purpose
            except ImportError as e:
                self._reason = f"NVML unavailable: cannot import pynvml (nvidia-ml-py): {e}"
                return
            self._module = pynvml
        nv = self._module
        try:
            nv.nvmlInit()
        except Exception as e:  # noqa: BLE001 - NVMLError: no driver, no library...
            self._reason = f"NVML unavailable: {type(e).__name__}: {e}".rstrip(": ")
            return
        try:
            count = int(nv.nvmlDeviceGetCount())
            handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            uuids = [_text(self._call(nv.nvmlDeviceGetUUID, h) or "") for h in handles]
        except Exception as e:  # noqa: BLE001
            self._reason = f"NVML device enumeration failed: {type(e).__name__}: {e}"
            self._shutdown()
            return
        self._all, self._uuids = handles, uuids
        self._migs = self._mig_devices(handles)
        self._handles = self._select(self._visible_spec)
        self._available = True

    def _mig_devices(self, handles: list[Any]) -> dict[tuple[int, int], tuple[Any, str]]:
        """The MIG devices of the GPUs in MIG mode, by (GPU index, slot), in NVML's order; none
        where the module has no MIG calls (an older pynvml) or no GPU is in MIG mode. A slot
        NVML finds empty (NVML_ERROR_NOT_FOUND) is skipped."""
        nv = self._module
        mode_of = getattr(nv, "nvmlDeviceGetMigMode", None)
        slots_of = getattr(nv, "nvmlDeviceGetMaxMigDeviceCount", None)
        by_slot = getattr(nv, "nvmlDeviceGetMigDeviceHandleByIndex", None)
        if mode_of is None or slots_of is None or by_slot is None:
            return {}
        out: dict[tuple[int, int], tuple[Any, str]] = {}
        for g, h in enumerate(handles):
            mode = self._call(mode_of, h)
            if not isinstance(mode, (list, tuple)) or not mode or mode[0] != NVML_DEVICE_MIG_ENABLE:
                continue
            slots = self._call(slots_of, h)
            for k in range(min(slots, MAX_MIG_SLOTS) if isinstance(slots, int) else 0):
                mh = self._call(by_slot, h, k)
                uuid = self._call(nv.nvmlDeviceGetUUID, mh) if mh is not None else None
                if uuid:
                    out[(g, k)] = (mh, _text(uuid))
        return out

    def _select(self, visible_devices: str | None) -> list[tuple[int, Any, int | None]]:
        """The devices `visible_devices` (a CUDA_VISIBLE_DEVICES value) selects."""
        migs = [(g, k, u) for (g, k), (_, u) in self._migs.items()]
        out: list[tuple[int, Any, int | None]] = []
        for key in visible_indices(visible_devices, len(self._all), self._uuids, migs):
            if isinstance(key, tuple):
                out.append((key[0], self._migs[key][0], key[1]))
            else:
                out.append((key, self._all[key], None))
        return out

    def restricted(self, visible_devices: str | None) -> NvmlSource:
        """The same NVML session seen through another CUDA_VISIBLE_DEVICES value (a launched
        server's own, from its spec's `gpus` or `env`): its samples are of the server's GPUs only.
        Unavailable when this source is."""
        self._start()
        view = NvmlSource(self._module, visible_devices)
        view._started, view._owner, view._reason, view._session = True, False, self._reason, self._session
        if self._available:
            view._available, view._all, view._uuids, view._migs = True, self._all, self._uuids, self._migs
            view._handles = view._select(visible_devices)
        return view

    def _shutdown(self) -> None:
        try:
            self._module.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass

    def stall(self, reason: str) -> None:
        """A call into NVML did not return (the runner gave up waiting: a GPU fallen off the bus,
        a wedged driver). NVML serializes its calls, so every later one would hang behind it:
        from now on this session (and each view of it) samples nothing (`sample` is None:
        unknown, never a figure) and is not shut down (`nvmlShutdown` would hang too)."""
        self._session["stalled"] = self._session["stalled"] or reason

    @property
    def stalled(self) -> str | None:
        """Why sampling stopped mid-run (`stall`), or None."""
        return self._session["stalled"]

    def close(self) -> None:
        if self._started and self._available and self._owner and self.stalled is None:
            self._shutdown()
        self._available = False
        self._reason = self._reason or "closed"

    @property
    def available(self) -> bool:
        self._start()
        return self._available

    @property
    def reason(self) -> str | None:
        self._start()
        return self._reason

    @staticmethod
    def _call(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends -> unknown
            return None

    # -- inventory and samples --------------------------------------------------------------

    def gpu_inventory(self) -> dict[str, Any]:
        """The manifest's `gpus`: `{"available": False, "reason"}` or the visible devices."""
        if not self.available:
            return {"available": False, "reason": self._reason or "NVML unavailable"}
        nv = self._module
        driver = self._call(nv.nvmlSystemGetDriverVersion)
        cuda = self._call(nv.nvmlSystemGetCudaDriverVersion)
        driver_s = _text(driver) if driver is not None else None
        cuda_s = _cuda_version(int(cuda)) if isinstance(cuda, int) else None
        devices = []
        for visible, (index, h, slot) in enumerate(self._handles):
            name = self._call(nv.nvmlDeviceGetName, h)
            uuid = self._call(nv.nvmlDeviceGetUUID, h)
            mem = self._call(nv.nvmlDeviceGetMemoryInfo, h)
            device = {
                "index": index,
                "visible_index": visible,
                "name": _text(name) if name is not None else None,
                "uuid_sha256": hashlib.sha256(_text(uuid).encode()).hexdigest() if uuid else None,
                "memory_total": int(mem.total) if mem is not None else None,
                "driver_version": driver_s,
                "cuda_version": cuda_s,
            }
            if slot is not None:
                device["mig"] = self._mig_entry(h, slot)
            devices.append(device)
        return {
            "available": True,
            "driver_version": driver_s,
            "cuda_version": cuda_s,
            "cuda_visible_devices": self._visible_spec,
            "devices": devices,
        }

    def sample(self, pids: Iterable[int] = (), *, tree: Iterable[int] | None = None) -> list[dict[str, Any]] | None:
        """Per visible GPU: memory used, memory used by the process trees of `pids` (None when
        there is no tree or its figure is unknown: see `_tree_memory`), utilization (%),
        temperature (C), power (W); any value NVML does not give is None. None when NVML is
        unavailable, or stopped answering (`stall`). `tree`: those trees' pids already listed
        (`telemetry_record` lists /proc once a sample), in place of listing them from `pids`."""
        if not self.available or self.stalled is not None:
            return None
        nv = self._module
        if tree is None:
            tree = set()
            for pid in pids:
                tree.update(_whole(process_tree_pids, pid) or ())  # /proc unreadable: no tree, its memory unknown
        tree = set(tree)
        out = []
        for index, h, slot in self._handles:
            mem = self._call(nv.nvmlDeviceGetMemoryInfo, h)
            procs = self._call(nv.nvmlDeviceGetComputeRunningProcesses, h)
            proc_mem = _tree_memory(procs, tree)
            # a MIG device: no utilization of its own, and the GPU's temperature and power are
            # not the slice's (see the module doc): unknown, never the GPU's figure
            util = self._call(nv.nvmlDeviceGetUtilizationRates, h) if slot is None else None
            temp = self._call(nv.nvmlDeviceGetTemperature, h, NVML_TEMPERATURE_GPU) if slot is None else None
            power = self._call(nv.nvmlDeviceGetPowerUsage, h) if slot is None else None
            row = {
                "index": index,
                "memory_used": int(mem.used) if mem is not None else None,
                "process_memory_used": proc_mem,
                "utilization_gpu": float(util.gpu) if util is not None else None,
                "temperature_c": float(temp) if temp is not None else None,
                "power_w": power / 1000.0 if isinstance(power, (int, float)) else None,
            }
            if slot is not None:
                row["mig_slot"] = slot
            out.append(row)
        return out

    def _mig_entry(self, h: Any, slot: int) -> dict[str, Any]:
        """A MIG device's place on its GPU: its slot, and its GPU and compute instance ids
        (None where NVML does not say)."""
        ids = {}
        for key, name in (("gpu_instance_id", "nvmlDeviceGetGpuInstanceId"), ("compute_instance_id", "nvmlDeviceGetComputeInstanceId")):
            fn = getattr(self._module, name, None)  # absent from an older pynvml
            got = self._call(fn, h) if fn is not None else None
            ids[key] = got if isinstance(got, int) else None
        return {"slot": slot, **ids}


def _tree_memory(procs: Any, tree: set[int]) -> int | None:
    """GPU memory of the processes of `tree` in NVML's process list `procs`; None (unknown,
    never 0) without a process tree to look for (a `url` backend, a server already gone), without
    a list (the call failed or is not supported), or when a process of the tree is listed with no
    memory figure (pynvml's None: NVML_VALUE_NOT_AVAILABLE)."""
    if procs is None or not tree:
        return None
    total = 0
    for p in procs:
        if getattr(p, "pid", None) not in tree:
            continue
        used = getattr(p, "usedGpuMemory", None)
        if isinstance(used, bool) or not isinstance(used, int):
            return None
        total += used
    return total


# --- /proc -----------------------------------------------------------------------------------


def _ppid_map() -> dict[int, int]:
    """Each process's parent, from one listing of /proc. A process that exited meanwhile, or
    another user's that /proc hides (mounted hidepid=1), is left out; a stat refused otherwise
    (the load generator out of file descriptors: EMFILE) raises, as `_rss`'s: a tree listed
    without some of its processes would be summed short of them and recorded as measured
    (`telemetry_record` records it unknown)."""
    out: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        # "pid (comm) state ppid ...": comm may contain spaces and parentheses
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) >= 2:
            out[int(entry.name)] = int(fields[1])
    return out


def process_tree_pids(pid: int) -> list[int]:
    """`pid` and all its descendants (from /proc); empty when `pid` does not exist."""
    if not Path(f"/proc/{pid}").exists():
        return []
    children: dict[int, list[int]] = {}
    for child, parent in _ppid_map().items():
        children.setdefault(parent, []).append(child)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def _rss(pid: int) -> int:
    """`pid`'s VmRSS in bytes; 0 when it exited meanwhile, is a zombie or a kernel thread. A
    read refused otherwise (the load generator out of file descriptors: EMFILE) raises: the
    tree's figure is then unknown (`telemetry_record`), never a sum short of this process."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        pass
    return 0


def process_tree_rss(pid: int) -> int | None:
    """Resident memory (bytes) of `pid` and its descendants, the sum of each one's VmRSS; None
    when `pid` does not exist. A page the processes share (a forked worker's copy-on-write
    heap, the CUDA and torch libraries every worker maps) is counted once per process here:
    `process_tree_pss` is what the judge's `rss` reads."""
    return _tree_rss(process_tree_pids(pid))


def _tree_rss(pids: list[int]) -> int | None:
    """`process_tree_rss` of a tree already listed (`process_tree_pids`)."""
    if not pids:
        return None
    return sum(_rss(p) for p in pids)


def _pss(pid: int) -> int | None:
    """`pid`'s proportional set size in bytes (/proc/PID/smaps_rollup, Linux 4.14+: each
    resident page divided by the number of processes mapping it), 0 when it exited meanwhile,
    None when the kernel has no smaps_rollup or refuses it."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        return None if Path(f"/proc/{pid}").exists() else 0  # no such file: the kernel's; no process: exited
    except (OSError, ValueError, IndexError):
        return None
    return 0  # a kernel thread or a zombie: no mappings


def process_tree_pss(pid: int) -> int | None:
    """Resident memory of `pid` and its descendants with every page counted once: the sum of
    their PSS. A server that forks workers after loading (vLLM's engine core and its TP
    workers, a gunicorn-style pre-fork) shares most of its pages among them; summing RSS
    counted a 200 MB heap four times over three idle forked children (858 MiB where PSS says
    223). Pages shared with processes outside the tree (the C library) count in proportion,
    so the figure is the tree's fair share. None when `pid` does not exist or a process's PSS
    cannot be read (an older kernel, a process of another user): the RSS sum stands instead."""
    return _tree_pss(process_tree_pids(pid))


def _tree_pss(pids: list[int]) -> int | None:
    """`process_tree_pss` of a tree already listed (`process_tree_pids`)."""
    if not pids:
        return None
    total = 0
    for p in pids:
        got = _pss(p)
        if got is None:
            return None
        total += got
    return total


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_ticks(pid: int) -> int:
    """utime + stime + cutime + cstime of `pid` (clock ticks): its own CPU and that of the
    children it has reaped (a child still running is counted as itself, never twice)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):  # exited meanwhile; any other refusal raises, as `_rss`'s
        return 0
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return sum(int(fields[i]) for i in (11, 12, 13, 14))
    except (IndexError, ValueError):
        return 0


def process_tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) used so far by `pid` and its descendants; None when `pid`
    does not exist."""
    return _tree_cpu_seconds(process_tree_pids(pid))


def _tree_cpu_seconds(pids: list[int]) -> float | None:
    """`process_tree_cpu_seconds` of a tree already listed (`process_tree_pids`)."""
    if not pids:
        return None
    return sum(_cpu_ticks(p) for p in pids) / _CLK_TCK


class CpuMeter:
    """CPU utilisation of a process tree between consecutive samples: 100 = one core busy.
    The first sample (nothing to compare with) and a tree whose total went down (a child
    exited unreaped) give None."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None

    def sample(self, pid: int | None, t: float) -> tuple[float | None, float | None]:
        """(cumulative CPU seconds, percent since the previous sample)."""
        return self.of(process_tree_cpu_seconds(pid) if pid else None, t)

    def of(self, total: float | None, t: float) -> tuple[float | None, float | None]:
        """`sample` of the tree's CPU seconds `total` already read (None: unknown, which
        leaves the previous sample to compare the next with)."""
        if total is None:
            return None, None
        last, self._last = self._last, (t, total)
        if last is None or t <= last[0] or total < last[1]:
            return total, None
        return total, round(100.0 * (total - last[1]) / (t - last[0]), 3)


def telemetry_record(source: NvmlSource | None, server_pid: int | None, t: float | None = None,
                     cpu: CpuMeter | None = None) -> dict[str, Any]:
    """One line of telemetry.jsonl (schema "telemetry"). With a `cpu` meter (one per backend,
    kept between samples) it also carries the server tree's CPU: `server_cpu_s` (cumulative) and
    `server_cpu_percent` (since the previous sample; 100 = one core). `t`: the run clock's time
    (the runner passes it; the wall clock, which a step moves, only when none is given)."""
    t = time.time() if t is None else t
    # the server's tree from one listing of /proc, shared by its four figures (each listed it:
    # four scans of every process on the host a sample); None where there is no server or
    # /proc could not be listed whole, which makes each figure unknown
    tree = _whole(process_tree_pids, server_pid) if server_pid else None
    row = {
        "schema_version": 1,
        "t": t,
        "server_pid": server_pid,
        "server_rss_bytes": _whole(_tree_rss, tree) if tree else None,
        "server_pss_bytes": _whole(_tree_pss, tree) if tree else None,
        "gpus": source.sample(tree=tree or ()) if source is not None else None,
    }
    if cpu is not None:
        row["server_cpu_s"], row["server_cpu_percent"] = cpu.of(_whole(_tree_cpu_seconds, tree) if tree else None, t)
    return row


def _whole(figure: Any, *args: Any) -> Any:
    """`figure(*args)`, or None (unknown) where /proc could not be read whole: the load
    generator out of file descriptors (EMFILE) while its requests are, too, is the client's
    failure, which the records say; a sample must not abort the run for it (the OSError did,
    exit 4), nor record a sum of the part of the tree it could read."""
    try:
        return figure(*args)
    except OSError:
        return None

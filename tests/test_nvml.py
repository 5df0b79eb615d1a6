"""GPU telemetry through NVML (a fake module with two GPUs; the real one on this GPU-less host)
and process-tree memory from /proc (a real subprocess tree)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import types

import pytest

from soakspec.evidence import schema
from soakspec.evidence.telemetry import (NvmlSource, process_tree_pids, process_tree_pss, process_tree_rss, telemetry_record,
                                         visible_indices)

GiB = 1 << 30


class NVMLError(Exception):
    pass


class FakeNvml:
    """The pynvml functions soakspec uses, for two GPUs; power is unsupported on GPU 1."""

    NVMLError = NVMLError

    def __init__(self, procs=None, fail_init=False):
        self.procs = procs or {}
        self.fail_init = fail_init
        self.inits = 0
        self.shutdowns = 0
        self.uuids = ["GPU-aaaa-1111", "GPU-bbbb-2222"]

    def nvmlInit(self):
        self.inits += 1
        if self.fail_init:
            raise NVMLError("Driver Not Loaded")

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("h", i)

    def nvmlSystemGetDriverVersion(self):
        return b"550.54.15"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12040

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h):
        return self.uuids[h[1]]

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(total=80 * GiB, used=(10 + h[1]) * GiB, free=0)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in self.procs.get(h[1], [])]

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 61

    def nvmlDeviceGetPowerUsage(self, h):
        if h[1] == 1:
            raise NVMLError("Not Supported")
        return 350_500


def test_inventory_of_two_gpus_hashes_uuids():
    nv = FakeNvml()
    inv = NvmlSource(nv, visible_devices=None).gpu_inventory()
    assert inv["available"] is True and inv["driver_version"] == "550.54.15" and inv["cuda_version"] == "12.4"
    assert [d["index"] for d in inv["devices"]] == [0, 1]
    d0 = inv["devices"][0]
    assert d0["name"] == "NVIDIA H100 80GB HBM3" and d0["memory_total"] == 80 * GiB
    assert d0["uuid_sha256"] == hashlib.sha256(b"GPU-aaaa-1111").hexdigest()
    assert "GPU-aaaa" not in repr(inv)
    assert not schema.validate("manifest", _manifest_with(inv))


def test_cuda_visible_devices_selects_gpus():
    assert [d["index"] for d in NvmlSource(FakeNvml(), visible_devices="1").gpu_inventory()["devices"]] == [1]
    inv = NvmlSource(FakeNvml(), visible_devices="GPU-bbbb").gpu_inventory()
    assert [d["index"] for d in inv["devices"]] == [1] and inv["cuda_visible_devices"] == "GPU-bbbb"
    assert NvmlSource(FakeNvml(), visible_devices="").gpu_inventory()["devices"] == []
    assert visible_indices("1,0,7,0", 2, []) == [1, 0]  # CUDA stops at the first bad entry
    assert visible_indices(None, 2, []) == [0, 1]


def test_sample_sums_gpu_memory_of_the_server_process_tree():
    me = os.getpid()
    nv = FakeNvml(procs={0: [(me, 3 * GiB), (999_999_999, 5 * GiB)], 1: [(me, None)]})
    s = NvmlSource(nv, visible_devices=None).sample([me])
    assert s[0] == {"index": 0, "memory_used": 10 * GiB, "process_memory_used": 3 * GiB,
                    "utilization_gpu": 87.0, "temperature_c": 61.0, "power_w": 350.5}
    # the server's process listed without a figure (NVML_VALUE_NOT_AVAILABLE): unknown, not 0
    assert s[1]["process_memory_used"] is None and s[1]["power_w"] is None  # unsupported -> unknown
    assert NvmlSource(FakeNvml(procs={0: [(999_999_999, GiB)]}), visible_devices=None).sample([me])[0][
        "process_memory_used"] == 0  # the server's tree holds nothing on that GPU: a true 0
    rec = telemetry_record(NvmlSource(nv, visible_devices=None), me, t=1.0)
    assert not schema.validate("telemetry", rec) and rec["server_rss_bytes"] > 0


def test_process_memory_is_unknown_without_a_server_process():
    """A `url` backend (no pid) or a server already gone has no process tree to find in NVML's
    list: its GPU memory is unknown (None), never 0, which `max(gpu_memory) < X` would pass."""
    nv = FakeNvml(procs={0: [(424_242, 30 * GiB)]})  # the server's memory, under a pid we cannot see
    rec = telemetry_record(NvmlSource(nv, visible_devices=None), None, t=1.0)
    assert [g["process_memory_used"] for g in rec["gpus"]] == [None, None]
    assert [g["memory_used"] for g in rec["gpus"]] == [10 * GiB, 11 * GiB]  # the device's own figure stays
    assert not schema.validate("telemetry", rec)
    gone = NvmlSource(nv, visible_devices=None).sample([999_999_999])
    assert [g["process_memory_used"] for g in gone] == [None, None]


def test_init_failure_is_recorded_once_never_raised():
    nv = FakeNvml(fail_init=True)
    src = NvmlSource(nv)
    assert src.available is False and "Driver Not Loaded" in src.reason
    assert src.sample([os.getpid()]) is None
    assert src.gpu_inventory() == {"available": False, "reason": src.reason}
    assert nv.inits == 1


def test_real_pynvml_on_this_host_reports_unavailable_with_a_reason():
    src = NvmlSource()
    if src.available:  # pragma: no cover - only on GPU hosts
        pytest.skip("this host has an NVIDIA driver")
    assert src.reason and "NVML" in src.reason
    inv = src.gpu_inventory()
    assert inv["available"] is False and not schema.validate("manifest", _manifest_with(inv))
    rec = telemetry_record(src, None, t=1.0)
    assert rec["gpus"] is None and not schema.validate("telemetry", rec)


def test_import_failure_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    src = NvmlSource()
    assert src.available is False and "cannot import pynvml" in src.reason


def _kill_tree(parent: subprocess.Popen) -> None:
    """SIGKILL a test's process and its descendants, the deepest first, and reap it."""
    for pid in process_tree_pids(parent.pid)[::-1]:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    parent.wait()


def test_process_tree_rss_counts_descendants():
    code = (
        "import subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'b = bytearray(40 << 20); import time; print(1, flush=True); time.sleep(60)'], stdout=subprocess.PIPE) for _ in range(2)]\n"
        "[k.stdout.readline() for k in kids]\n"
        "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        kids = [int(p) for p in parent.stdout.readline().split()]
        tree = process_tree_pids(parent.pid)
        assert tree[0] == parent.pid and set(kids) <= set(tree)
        total = process_tree_rss(parent.pid)
        alone = process_tree_rss(kids[0])
        assert alone >= 40 << 20
        assert total >= 80 << 20 and total > alone
    finally:
        _kill_tree(parent)
    time.sleep(0.05)
    assert process_tree_rss(parent.pid) is None and process_tree_pids(parent.pid) == []


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="the kernel has no smaps_rollup (before 4.14)")
def test_a_forked_servers_shared_pages_count_once_in_its_memory():
    """A server that forks workers after loading shares its heap with them: the RSS sum counted
    a 64 MiB heap once per process (four times), the PSS sum -- what the judge's `rss` reads --
    about once. (An audit: 858 MiB read for ~223 MiB resident, a `max(rss)` rule failed.)"""
    code = (
        "import os, sys, time\n"
        "heap = bytearray(64 << 20)\n"
        "for i in range(0, len(heap), 4096): heap[i] = 1\n"  # resident
        "kids = []\n"
        "for _ in range(3):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        time.sleep(60); os._exit(0)\n"
        "    kids.append(pid)\n"
        "print(' '.join(map(str, kids)), flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        kids = [int(p) for p in parent.stdout.readline().split()]
        assert len(kids) == 3 and set(kids) <= set(process_tree_pids(parent.pid))
        rss, pss = process_tree_rss(parent.pid), process_tree_pss(parent.pid)
        assert rss >= 4 * (64 << 20), rss  # the heap in each of the four processes
        assert (64 << 20) <= pss < 2 * (64 << 20), (pss, rss)  # once, and the interpreters' own pages
        rec = telemetry_record(None, parent.pid, t=1.0)
        assert not schema.validate("telemetry", rec) and rec["server_pss_bytes"] < rec["server_rss_bytes"]
    finally:
        _kill_tree(parent)
    time.sleep(0.05)
    assert process_tree_pss(parent.pid) is None


def test_the_judges_rss_reads_a_samples_pss_and_evidence_from_before_its_rss():
    from soakspec.judge.measures import rss

    assert rss({"t": 1.0, "server_rss_bytes": 900, "server_pss_bytes": 300}) == 300
    assert rss({"t": 1.0, "server_rss_bytes": 900, "server_pss_bytes": None}) == 900  # PSS unreadable
    assert rss({"t": 1.0, "server_rss_bytes": 900}) == 900  # written before PSS was recorded


def _manifest_with(gpus):
    from soakspec.evidence.manifest import new_manifest

    return new_manifest(run_id="r", spec_text="x", spec_path=None, started_at=1_747_000_000.0, gpus=gpus)


def test_a_restricted_view_samples_only_its_devices_and_shares_the_session():
    nv = FakeNvml()
    src = NvmlSource(nv, visible_devices=None)
    assert [g["index"] for g in src.restricted("GPU-bbbb").sample()] == [1]
    assert [g["index"] for g in src.restricted("1,0").sample()] == [1, 0]
    assert src.restricted("").sample() == []
    src.restricted("0").close()
    assert nv.shutdowns == 0 and src.available  # a view never ends its parent's NVML session
    src.close()
    assert nv.shutdowns == 1
    off = NvmlSource(FakeNvml(fail_init=True)).restricted("0")
    assert off.available is False and "Driver Not Loaded" in off.reason and off.sample() is None


async def test_a_launched_servers_telemetry_is_of_its_own_gpus(tmp_path):
    """`gpus = [1]` sets the server's CUDA_VISIBLE_DEVICES, not soakspec's: its telemetry is of
    GPU 1 alone, not of every GPU soakspec sees (another tenant's GPU 0 would count in
    gpu_memory_device and the manifest's inventory would be taken for the server's)."""
    import json

    import trio

    from soakspec.judge.testing import spec_from_text
    from soakspec.plan import plan
    from soakspec.runner.backend import Deps, sample_telemetry
    from soakspec.runner.clock import RunClock
    from soakspec.runner.engine import h11_connect
    from soakspec.runner.progress import Progress
    from soakspec.runner.recorder import BackendRecorder, RunStatus
    from soakspec.evidence.layout import RunLayout

    text = ('soak "g" {}\nbackend "s" {\n  sim {}\n  gpus = [1]\n  runtime {\n    label = "x"\n  }\n}\n'
            'workload "w" {\n  load {\n    mode = closed\n    concurrency = [1]\n  }\n  duration = 1m\n  bucket = 1m\n'
            '  deadline = 30s\n}\ngate {\n  require failed == 0\n}\n')
    (bp,) = plan(spec_from_text(text)).backends
    assert dict(bp.launch.env)["CUDA_VISIBLE_DEVICES"] == "1"
    layout = RunLayout(tmp_path / "ev")
    rec = BackendRecorder(bp, layout, RunStatus())
    rec.prepare(0, None)
    clock = RunClock()
    deps = Deps(clock, Progress(quiet=True), None, h11_connect(clock), layout,
                nvml=NvmlSource(FakeNvml(), visible_devices=None))
    with trio.move_on_after(0.3):
        await sample_telemetry(deps, rec, 0.05)
    rows = [json.loads(x) for x in layout.telemetry("s").read_text().splitlines()]
    assert rows and all([g["index"] for g in r["gpus"]] == [1] for r in rows)


def _run_requiring_gpus(tmp_path, monkeypatch, visible: str, nvml):
    """A run of a spec with `require_gpus = true` against a server that is not there, under
    CUDA_VISIBLE_DEVICES=`visible` and the NVML module `nvml`."""
    from soakspec.judge.testing import spec_from_text
    from soakspec.plan import plan
    from soakspec.runner.engine import RunOptions, execute

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    text = ('soak "g" {}\ntelemetry {\n  require_gpus = true\n}\nbackend "u" {\n  url = "http://127.0.0.1:9"\n'
            '  ready {\n    timeout = 2s\n  }\n  runtime {\n    label = "x"\n  }\n}\n'
            'workload "w" {\n  load {\n    mode = closed\n    concurrency = [1]\n  }\n  duration = 1s\n  bucket = 1s\n'
            '  deadline = 1s\n}\ngate {\n  require failed == 0\n}\n')
    return execute(plan(spec_from_text(text)), RunOptions(out_dir=tmp_path / "run", quiet=True, nvml_module=nvml))


def test_require_gpus_is_not_met_by_nvml_with_no_visible_device(tmp_path, monkeypatch):
    """NVML loads but CUDA_VISIBLE_DEVICES selects no device (empty, an unknown GPU or MIG UUID): a
    spec with `require_gpus = true` stops before any load, as without NVML, saying why."""
    result = _run_requiring_gpus(tmp_path, monkeypatch, "GPU-ffff", FakeNvml())
    assert result.status == "aborted" and "requires GPUs" in (result.reason or ""), result.reason
    assert "GPU-ffff" in result.reason


async def test_a_hung_nvml_call_neither_hangs_the_run_nor_reads_as_a_figure(tmp_path, monkeypatch):
    """A wedged driver (a GPU fallen off the bus) hangs NVML's calls. The sampler gives the call
    up after SAMPLE_TIMEOUT_S, says so, goes on sampling the server without GPUs (`gpus` unknown,
    never a figure), and neither the end of sampling nor NVML's shutdown waits for the hung call."""
    import json
    import threading

    import trio

    from soakspec.judge.testing import spec_from_text
    from soakspec.plan import plan
    from soakspec.runner import backend
    from soakspec.runner.backend import Deps, sample_telemetry
    from soakspec.runner.clock import RunClock
    from soakspec.runner.engine import h11_connect
    from soakspec.runner.progress import Progress
    from soakspec.runner.recorder import BackendRecorder, RunStatus
    from soakspec.evidence.layout import RunLayout

    release = threading.Event()

    class Wedged(FakeNvml):
        calls = 0

        def nvmlDeviceGetMemoryInfo(self, h):
            Wedged.calls += 1
            if Wedged.calls > 2:  # the first sample (two GPUs) answers, then the driver wedges
                release.wait(30)  # bounded: the test releases it at its end
            return super().nvmlDeviceGetMemoryInfo(h)

    monkeypatch.setattr(backend, "SAMPLE_TIMEOUT_S", 0.2)
    text = ('soak "g" {}\nbackend "s" {\n  url = "http://127.0.0.1:9"\n  runtime {\n    label = "x"\n  }\n}\n'
            'workload "w" {\n  load {\n    mode = closed\n    concurrency = [1]\n  }\n  duration = 1m\n  bucket = 1m\n'
            '  deadline = 30s\n}\ngate {\n  require failed == 0\n}\n')
    (bp,) = plan(spec_from_text(text)).backends
    layout = RunLayout(tmp_path / "ev")
    rec = BackendRecorder(bp, layout, RunStatus())
    rec.prepare(0, None)
    nv = Wedged()
    nvml = NvmlSource(nv, visible_devices=None)
    logged: list[str] = []
    progress = Progress(quiet=True)
    monkeypatch.setattr(progress, "log", logged.append)
    deps = Deps(RunClock(), progress, None, h11_connect(RunClock()), layout, nvml=nvml)
    try:
        with trio.fail_after(5):  # the end of sampling does not wait for the hung call
            with trio.move_on_after(1.0):
                await sample_telemetry(deps, rec, 0.05)
        with trio.fail_after(5):
            await trio.to_thread.run_sync(nvml.close)  # no nvmlShutdown behind the hung call
    finally:
        release.set()
    rows = [json.loads(x) for x in layout.telemetry("s").read_text().splitlines()]
    assert isinstance(rows[0]["gpus"], list) and rows[0]["gpus"][0]["memory_used"] == 10 * GiB
    assert len(rows) >= 3 and all(r["gpus"] is None for r in rows[1:])  # sampled on, GPUs unknown
    assert nv.shutdowns == 0 and "did not answer within 0.2s" in (nvml.stalled or "")
    assert len(logged) == 1 and "GPU telemetry stops" in logged[0]


def test_a_hung_nvml_init_does_not_hang_the_run_before_it_begins(tmp_path, monkeypatch):
    """nvmlInit itself hangs on a wedged driver. The inventory is given up after
    INVENTORY_TIMEOUT_S: the manifest says NVML did not answer, and a spec that requires GPUs
    stops there, saying so, instead of soakspec hanging (deaf to Ctrl-C) before the run began."""
    import json
    import threading

    from soakspec.judge.testing import spec_from_text
    from soakspec.plan import plan
    from soakspec.runner import engine

    release = threading.Event()

    class Wedged(FakeNvml):
        def nvmlInit(self):
            release.wait(30)  # bounded: released at the test's end

    monkeypatch.setattr(engine, "INVENTORY_TIMEOUT_S", 0.2)
    text = ('soak "g" {}\ntelemetry {\n  require_gpus = true\n}\nbackend "u" {\n  url = "http://127.0.0.1:9"\n'
            '  runtime {\n    label = "x"\n  }\n}\n'
            'workload "w" {\n  load {\n    mode = closed\n    concurrency = [1]\n  }\n  duration = 1s\n  bucket = 1s\n'
            '  deadline = 1s\n}\ngate {\n  require failed == 0\n}\n')
    nv = Wedged()
    try:
        result = engine.execute(plan(spec_from_text(text)), engine.RunOptions(out_dir=tmp_path / "run", quiet=True,
                                                                                nvml_module=nv))
    finally:
        release.set()
    assert result.status == "aborted" and "NVML did not answer within 0.2s" in result.reason
    m = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert m["gpus"] == {"available": False, "reason": "NVML did not answer within 0.2s (nvmlInit and the GPU inventory)"}
    assert nv.shutdowns == 0


class FakeMigNvml(FakeNvml):
    """FakeNvml with GPU 1 in MIG mode (as pynvml's MIG calls answer): slots 0 and 2 hold MIG
    devices of 20 GiB (1g.20gb), slot 1 is empty (NVML_ERROR_NOT_FOUND); GPU 0 is not in MIG
    mode. A slice answers memory and its processes; NVML gives no utilization for it."""

    MIG_UUIDS = {0: "MIG-cccc-3333", 2: "MIG-dddd-4444"}

    def nvmlDeviceGetMigMode(self, h):
        return [1, 1] if h == ("h", 1) else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, k):
        if h != ("h", 1) or k not in self.MIG_UUIDS:
            raise NVMLError("Not Found")
        return ("mig", 1, k)

    def nvmlDeviceGetGpuInstanceId(self, h):
        return 3 + h[2] if h[0] == "mig" else self._not_mig()

    def nvmlDeviceGetComputeInstanceId(self, h):
        return 0 if h[0] == "mig" else self._not_mig()

    @staticmethod
    def _not_mig():
        raise NVMLError("Invalid Argument")

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H100 80GB HBM3 MIG 1g.20gb" if h[0] == "mig" else super().nvmlDeviceGetName(h)

    def nvmlDeviceGetUUID(self, h):
        return self.MIG_UUIDS[h[2]] if h[0] == "mig" else super().nvmlDeviceGetUUID(h)

    def nvmlDeviceGetMemoryInfo(self, h):
        if h[0] == "mig":
            return types.SimpleNamespace(total=20 * GiB, used=(4 + h[2]) * GiB, free=0)
        return super().nvmlDeviceGetMemoryInfo(h)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        if h[0] == "mig":
            return [types.SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in self.procs.get(("mig", h[2]), [])]
        return super().nvmlDeviceGetComputeRunningProcesses(h)

    def nvmlDeviceGetUtilizationRates(self, h):
        if h[0] == "mig":
            raise NVMLError("Not Supported")
        return super().nvmlDeviceGetUtilizationRates(h)


def test_a_mig_uuid_selects_that_slice_of_its_gpu():
    """A server on a slice of an H100 is given CUDA_VISIBLE_DEVICES=MIG-<uuid>: the slice is the
    device soakspec inventories (its own name, memory and hashed UUID, its place on GPU 1), not
    nothing -- which made `require_gpus = true` abort a MIG soak before its load."""
    inv = NvmlSource(FakeMigNvml(), visible_devices="MIG-dddd").gpu_inventory()
    (d,) = inv["devices"]
    assert d["index"] == 1 and d["mig"] == {"slot": 2, "gpu_instance_id": 5, "compute_instance_id": 0}
    assert d["name"] == "NVIDIA H100 80GB HBM3 MIG 1g.20gb" and d["memory_total"] == 20 * GiB
    assert d["uuid_sha256"] == hashlib.sha256(b"MIG-dddd-4444").hexdigest() and "MIG-dddd" not in repr(d)
    assert not schema.validate("manifest", _manifest_with(inv))
    both = NvmlSource(FakeMigNvml(), visible_devices="MIG-cccc,MIG-dddd-4444").gpu_inventory()["devices"]
    assert [(d["index"], d["mig"]["slot"]) for d in both] == [(1, 0), (1, 2)]
    # as in CUDA: an entry that names no device ends the list; a GPU's index stays the whole GPU
    assert NvmlSource(FakeMigNvml(), visible_devices="MIG-zzzz,MIG-cccc").gpu_inventory()["devices"] == []
    assert [("mig" in d) for d in NvmlSource(FakeMigNvml(), visible_devices="1").gpu_inventory()["devices"]] == [False]
    # a prefix two slices share names neither (as a GPU UUID prefix): no guess at which
    assert NvmlSource(FakeMigNvml(), visible_devices="MIG-").gpu_inventory()["devices"] == []
    # a pynvml without the MIG calls (or no GPU in MIG mode): a MIG UUID names nothing, no error
    assert NvmlSource(FakeNvml(), visible_devices="MIG-cccc").gpu_inventory()["devices"] == []


def test_a_mig_slice_is_sampled_as_itself_and_unknown_where_nvml_gives_only_the_gpus_figure():
    """Memory used and the server's processes are the slice's; utilization (NVML gives none for
    a slice), temperature and power (the whole GPU's, which summed over its slices would count
    it once a slice) are unknown -- never the GPU's figure under the slice's name."""
    me = os.getpid()
    nv = FakeMigNvml(procs={("mig", 2): [(me, 3 * GiB)], 1: [(me, 9 * GiB)]})
    src = NvmlSource(nv, visible_devices=None)
    (g,) = src.restricted("MIG-dddd").sample([me])
    assert g == {"index": 1, "mig_slot": 2, "memory_used": 6 * GiB, "process_memory_used": 3 * GiB,
                 "utilization_gpu": None, "temperature_c": None, "power_w": None}
    whole = src.restricted("1").sample([me])[0]
    assert whole["memory_used"] == 11 * GiB and whole["temperature_c"] == 61.0 and "mig_slot" not in whole
    rec = telemetry_record(src.restricted("MIG-cccc,MIG-dddd"), me, t=1.0)
    assert [g["mig_slot"] for g in rec["gpus"]] == [0, 2] and not schema.validate("telemetry", rec)


def test_require_gpus_is_met_by_the_mig_slice_cuda_visible_devices_names(tmp_path, monkeypatch):
    """`require_gpus = true` with CUDA_VISIBLE_DEVICES naming a MIG slice: the run does not stop
    for want of a GPU (it goes on to the load, which here finds no server: aborted for that),
    and the manifest's inventory is the slice."""
    import json

    result = _run_requiring_gpus(tmp_path, monkeypatch, "MIG-dddd-4444", FakeMigNvml())
    assert "requires GPUs" not in (result.reason or ""), result.reason
    gpus = json.loads((tmp_path / "run" / "manifest.json").read_text())["gpus"]
    assert [(d["index"], d["mig"]["slot"]) for d in gpus["devices"]] == [(1, 2)]


def test_a_telemetry_sample_lists_proc_once(monkeypatch):
    """A sample's four figures of the server's tree (RSS, PSS, CPU, GPU memory) each listed
    /proc -- a scan of every process on the machine, four times a sample on a busy host. They
    now share one listing."""
    me = os.getpid()
    listings = []
    scandir = os.scandir

    def counted(path="."):
        if str(path) == "/proc":
            listings.append(path)
        return scandir(path)

    monkeypatch.setattr(os, "scandir", counted)
    from soakspec.evidence.telemetry import CpuMeter

    rec = telemetry_record(NvmlSource(FakeNvml(procs={0: [(me, 3 * GiB)]}), visible_devices=None), me, t=1.0, cpu=CpuMeter())
    assert len(listings) == 1
    assert rec["server_rss_bytes"] > 0 and rec["server_pss_bytes"] is not None and rec["server_cpu_s"] > 0
    assert rec["gpus"][0]["process_memory_used"] == 3 * GiB and not schema.validate("telemetry", rec)

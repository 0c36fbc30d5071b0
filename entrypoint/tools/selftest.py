"""`distrain selftest`: prove every mode on the hardware at hand, end to end through TensorFlow, in one command.

Each training check starts real workers the way a user's job does (`distrain run`, `distrain launch`,
`horovodrun`; under Slurm, jobs/selftest.job starts them with srun across the allocation) on
selftest_train.py, then judges what each rank wrote: the loss fell, every rank ended with the same weights, and
the collective named by the libraries themselves (NCCL's own log lines, Horovod's `mpi_enabled`/`gloo_enabled`).
Environment checks need no TensorFlow: the driver against the image's CUDA, /dev/shm, InfiniBand devices,
NCCL_* settings, proxies. A check that cannot run here is `skip` with the reason, never `pass`; the exit status
is 0 only when nothing failed.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict

from ..plan import PROXY_VARS
from . import hostcheck
from .selftest_arithmetic import judge_arithmetic, load_steps
from .selftest_rows import FAIL, PASS, SKIP, Row

# The first Linux driver of each CUDA release (NVIDIA's CUDA Toolkit release notes, "CUDA Toolkit and Corresponding
# Driver Versions"): what `nvidia-smi` must show for the CUDA an image's TensorFlow was built with.
FIRST_DRIVER = {"11.8": "520.61.05", "12.0": "525.60.13", "12.1": "530.30.02", "12.2": "535.54.03",
                "12.3": "545.23.06", "12.4": "550.54.14", "12.5": "555.42.02", "12.6": "560.28.03",
                "12.8": "570.86.10", "12.9": "575.51.03", "13.0": "580.65.06"}
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "selftest_train.py")


# ---- judging what the workers wrote (pure) ----

def judge_training(check: str, results: list[dict], expected_ranks: int, log: str = "",
                   seconds: float = 0.0) -> Row:
    """One training check's verdict from its ranks' results (selftest_train.py) and its log."""
    if len(results) != expected_ranks:
        tail = " | ".join(line for line in log.strip().splitlines()[-3:])
        return Row(check, FAIL, f"{len(results)} of {expected_ranks} ranks finished: {tail[:300]}", seconds)
    digests = {r["weights"] for r in results}
    if len(digests) != 1:
        return Row(check, FAIL, f"the ranks ended with different weights ({len(digests)} versions): they were not "
                                "kept in sync", seconds)
    fell = [r for r in results if r["loss_last"] < r["loss_first"]]
    if len(fell) != len(results):
        return Row(check, FAIL, f"the loss did not fall ({results[0]['loss_first']:.3f} -> "
                                f"{results[0]['loss_last']:.3f})", seconds)
    first = results[0]
    hosts = sorted({r["host"] for r in results})
    loss = f"loss {first['loss_first']:.3f} -> {first['loss_last']:.3f}"
    parts = ([f"{expected_ranks} ranks on {len(hosts)} node(s)", f"weights identical, {loss}"]
             if expected_ranks > 1 else [f"1 rank, {loss}"])
    collective = collective_used(first, log)
    if collective:
        parts.append(f"collective: {collective}")
    if "allreduce_busbw_gbs" in first:
        parts.append(f"all-reduce {first['allreduce_mib']} MiB: {first['allreduce_busbw_gbs']:.2f} GB/s bus bandwidth")
    return Row(check, PASS, "; ".join(parts), seconds)


def nccl_network(log: str) -> str:
    """The network NCCL chose, from its verdict `Using network X` and the devices of its `NET/X : Using ...` line.
    Never from the lines before the verdict: NCCL probes every transport first and logs `NET/Plugin: Could not
    find ...` and `NET/IB : No device found.` (even `NET/IB : Using [RO]; OOB eth0`) on a node without them
    (NCCL 2.28.9 on an H100 node: tests/unit/data/nccl-2.28-init-h100.log)."""
    verdicts = re.findall(r"NCCL INFO Using network (\w+)", log)
    if not verdicts:
        return ""
    network = verdicts[-1]
    devices = re.findall(rf"NCCL INFO NET/{network} ?: Using ([^;\n]*)", log)
    listed = devices[-1].replace("[RO]", "").strip() if devices else ""
    return f"{network} ({listed})" if listed else network


def collective_used(result: Mapping, log: str) -> str:
    """What carried the all-reduce, as the libraries report it (not as the settings ask)."""
    if result.get("size", 1) < 2:
        return ""
    nccl = nccl_network(log)
    if nccl:
        return f"NCCL over {nccl} (NCCL's own log)"
    if result.get("mode") == "horovod":
        return f"Horovod with {result.get('horovod_controller', '?')}" + (
            "" if result.get("gpus") else " on CPU (Horovod uses NCCL only for GPU tensors)")
    return "TensorFlow's ring collectives over gRPC" + ("" if result.get("gpus") else " (CPU: NCCL is for GPUs)")


def gpu_rows(result: Mapping | None, seconds: float = 0.0) -> list[Row]:
    """Mixed precision, XLA, memory growth and pinning from the single-rank result (or why they were skipped)."""
    names = ("GPU: mixed float16", "GPU: mixed bfloat16", "GPU: XLA", "GPU: memory growth")
    if result is None:
        return [Row(n, SKIP, "the single-rank check did not finish") for n in names]
    if not result.get("gpus"):
        why = "no GPU visible to TensorFlow" + ("" if result.get("cuda_build") else " (a CPU-only TensorFlow build)")
        return [Row(n, SKIP, why) for n in names]
    speeds = result.get("images_per_sec", {})
    base = speeds.get("float32")
    rows = []
    for name, key in (("GPU: mixed float16", "mixed_float16"), ("GPU: mixed bfloat16", "mixed_bfloat16"),
                      ("GPU: XLA", "xla")):
        if key not in speeds or not base:
            rows.append(Row(name, SKIP, "not supported by this GPU" if key == "mixed_bfloat16" else "not measured"))
            continue
        ratio = speeds[key] / base
        status = PASS if ratio >= 1.0 else FAIL
        rows.append(Row(name, status, f"{speeds[key]:.0f} images/s, {ratio:.2f}x float32 ({base:.0f})"
                        + ("" if status == PASS else ": slower than float32"), seconds))
    growth = result.get("memory_growth")
    rows.append(Row("GPU: memory growth", PASS if growth else FAIL,
                    "on for every GPU" if growth else "off: one process takes all GPU memory"))
    return rows


def pinning_row(results: list[dict]) -> Row:
    """Each rank of a node on its own GPU, told apart by PCI bus id (an index repeats across nodes)."""
    if not any(r.get("gpus") for r in results):
        return Row("GPU pinning", SKIP, "no GPU visible to TensorFlow")
    seen: dict[tuple[str, str], int] = {}
    for r in results:
        for gpu in r.get("gpus", []):
            key = (r["host"], gpu["pci_bus_id"])
            if key in seen:
                return Row("GPU pinning", FAIL, f"ranks {seen[key]} and {r['rank']} share GPU {gpu['pci_bus_id']} "
                                                f"on {r['host']}")
            seen[key] = r["rank"]
    return Row("GPU pinning", PASS, f"{len(seen)} GPU(s), each rank on its own (by PCI bus id)")


# ---- environment checks (no TensorFlow) ----

def driver_needed(image_cuda: str) -> str:
    """What the image's CUDA asks of the node's driver, in the terms nvidia-smi shows."""
    major_minor = ".".join(image_cuda.split(".")[:2])
    first = FIRST_DRIVER.get(major_minor)
    return f"a driver for CUDA {major_minor} or newer" + (f" (Linux {first}+)" if first else "")


def driver_row(image_cuda: str, smi: str | None = None) -> Row:
    """The driver's highest CUDA (`nvidia-smi`'s header) against the CUDA TensorFlow was built with."""
    if smi is None:
        binary = shutil.which("nvidia-smi")
        if binary is None:
            return Row("driver", SKIP, hostcheck.NO_NVIDIA_SMI + (
                f"; the image's CUDA {image_cuda} needs {driver_needed(image_cuda)}" if image_cuda else ""))
        smi = subprocess.run([binary], capture_output=True, text=True, timeout=60).stdout
    driver = re.search(r"Driver Version:\s*([\d.]+)", smi)
    supports = re.search(r"CUDA Version:\s*([\d.]+)", smi)
    if not driver or not supports:
        first_line = (smi.strip().splitlines() or ["(no output)"])[0][:120]
        return Row("driver", FAIL, f"nvidia-smi did not report a driver: {first_line}")
    detail = f"driver {driver.group(1)} supports CUDA up to {supports.group(1)}"
    if not image_cuda:
        return Row("driver", PASS, detail + "; TensorFlow here is not a CUDA build")
    if _version(supports.group(1)) < _version(image_cuda)[:2]:
        return Row("driver", FAIL, f"{detail}, older than the image's CUDA {image_cuda}, which needs "
                                   f"{driver_needed(image_cuda)}: ask the admins for a newer driver, or use an "
                                   "image built on an older CUDA")
    return Row("driver", PASS, f"{detail}; the image's TensorFlow uses CUDA {image_cuda}")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def shared_memory_row(gpus: int) -> Row:
    line, warning = hostcheck.shared_memory(gpus)
    if warning:
        return Row("/dev/shm", FAIL, warning)
    return Row("/dev/shm", PASS if gpus > 1 else SKIP, line.split(": ", 1)[1] + (
        "" if gpus > 1 else ": only NCCL between GPUs of one node needs it, and there are not several here"))


def infiniband_row(root: str = "/") -> Row:
    """InfiniBand adapters on the node (sysfs) and their verbs devices inside the container (/dev/infiniband)."""
    adapters = sorted(os.path.basename(p) for p in glob.glob(os.path.join(root, "sys/class/infiniband/*")))
    verbs = sorted(os.path.basename(p) for p in glob.glob(os.path.join(root, "dev/infiniband/uverbs*")))
    if not adapters and not verbs:
        return Row("InfiniBand", SKIP, "no InfiniBand adapter on this node: NCCL across nodes uses TCP sockets")
    if adapters and not verbs:
        return Row("InfiniBand", FAIL, f"adapters {', '.join(adapters)} but no /dev/infiniband/uverbs* here: bind "
                                       "/dev/infiniband into the container (apptainer --bind /dev/infiniband)")
    rates = []
    for adapter in adapters:
        for rate in glob.glob(os.path.join(root, f"sys/class/infiniband/{adapter}/ports/*/rate")):
            with open(rate) as handle:
                rates.append(f"{adapter}: {handle.read().strip()}")
    return Row("InfiniBand", PASS, f"{', '.join(verbs)} visible" + (f" ({'; '.join(rates)})" if rates else ""))


def link_gbits(root: str = "/") -> tuple[float, str] | None:
    """The fastest link out of the node, in Gb/s, and what it is: InfiniBand ports (sysfs `rate`), else Ethernet
    interfaces (sysfs `speed`, Mb/s); None where no speed is reported (virtual NICs, containers)."""
    best: tuple[float, str] | None = None
    for path in glob.glob(os.path.join(root, "sys/class/infiniband/*/ports/*/rate")):
        found = re.match(r"\s*([\d.]+)\s*Gb/sec", _read(path))
        if found and (best is None or float(found.group(1)) > best[0]):
            best = (float(found.group(1)), f"InfiniBand {path.split('/')[-4]}")
    if best:
        return best
    for path in glob.glob(os.path.join(root, "sys/class/net/*/speed")):
        name, speed = path.split("/")[-2], _read(path).strip()
        gbits = int(speed) / 1000 if speed.isdigit() else 0.0  # virtual NICs report -1 or nothing
        if name != "lo" and gbits > 0 and (best is None or gbits > best[0]):
            best = (gbits, f"Ethernet {name}")
    return best


def interconnect_row(results: list[dict], root: str = "/") -> Row:
    """The all-reduce bus bandwidth measured across nodes against what the node's fastest link can carry
    (link rate / 8); under half of it fails: the traffic likely took a slower path (TCP instead of InfiniBand,
    the wrong interface)."""
    measured = [r for r in results if "allreduce_busbw_gbs" in r]
    if len({r.get("machine", r["host"]) for r in measured}) < 2:
        return Row("interconnect", SKIP, "one node: the all-reduce did not cross a network (sbatch jobs/selftest.job "
                                         "over 2 nodes measures it)")
    busbw = max(r["allreduce_busbw_gbs"] for r in measured)
    link = link_gbits(root)
    if link is None:
        return Row("interconnect", SKIP, f"{busbw:.2f} GB/s bus bandwidth across nodes; the link's speed is not "
                                         "reported here, so there is nothing to compare it with")
    expected = link[0] / 8
    share = busbw / expected
    detail = f"{busbw:.2f} GB/s bus bandwidth across nodes, {share:.0%} of {link[1]}'s {link[0]:g} Gb/s"
    if share < 0.5:
        return Row("interconnect", FAIL, detail + ": the all-reduce likely took a slower path (check the NCCL "
                                                  "rows, NCCL_SOCKET_IFNAME, /dev/infiniband in the container)")
    return Row("interconnect", PASS, detail)


def nccl_row(env: Mapping[str, str], infiniband: bool) -> Row:
    settings = {k: v for k, v in env.items() if k.startswith("NCCL_")}
    shown = " ".join(f"{k}={v}" for k, v in sorted(settings.items())) or "none set (NCCL's defaults)"
    if infiniband and settings.get("NCCL_IB_DISABLE", "0") not in ("0", ""):
        return Row("NCCL settings", FAIL, f"{shown}: InfiniBand is here but NCCL_IB_DISABLE turns it off")
    if settings.get("NCCL_P2P_DISABLE", "0") not in ("0", ""):
        return Row("NCCL settings", FAIL, f"{shown}: NCCL_P2P_DISABLE slows GPUs of one node down: unset it")
    return Row("NCCL settings", PASS, shown)


def proxy_row(env: Mapping[str, str]) -> Row:
    proxies = [k for k in PROXY_VARS if env.get(k)]
    if not proxies:
        return Row("proxies", PASS, "none set")
    return Row("proxies", PASS, f"{' '.join(proxies)} set: distrain run unsets them for MWM (gRPC would send the "
                                "workers' traffic to the proxy)")


def environment_rows(env: Mapping[str, str], image_cuda: str, gpus: int) -> list[Row]:
    ib = infiniband_row()
    return [driver_row(image_cuda), shared_memory_row(gpus), ib, nccl_row(env, ib.status == PASS), proxy_row(env)]


# ---- running the checks ----

def read_results(directory: str) -> list[dict]:
    results = []
    for path in sorted(glob.glob(os.path.join(directory, "rank*.json"))):
        with open(path) as handle:
            results.append(json.load(handle))
    return results


def _run_check(name: str, command: list[str], env: dict[str, str], out: str, ranks: int,
               timeout: float) -> tuple[Row, list[dict]]:
    start = time.monotonic()
    try:
        proc = subprocess.run([*command, WORKER, "--out", out], env=env, capture_output=True, text=True,
                              timeout=timeout)
        log = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        log = f"{exc.stdout or ''}{exc.stderr or ''}\ntimed out after {timeout:.0f} s"
    results = read_results(out)
    return judge_training(name, results, ranks, log, time.monotonic() - start), results


def run_local(workers: int = 2, timeout: float = 300) -> list[Row]:
    """Every check this machine allows, with `workers` local workers for the multi-worker modes."""
    distrain = [sys.executable, "-m", "entrypoint"]
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "OMPI_", "PMI", "HOROVOD_", "TF_CONFIG")) and k != "DISTRAIN_MODE"}
    base.setdefault("NCCL_DEBUG", "INFO")  # NCCL's own lines say whether it carried the all-reduce, and how
    base.setdefault("DISTRAIN_CHECKPOINT", "0")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="distrain-selftest-") as scratch:
        single, single_results = _run_check("single", [*distrain, "run"], {**base, "DISTRAIN_MODE": "single"},
                                            os.path.join(scratch, "single"), 1, timeout)
        rows.append(single)
        first = single_results[0] if single_results else None
        gpus = len(first.get("gpus", [])) if first else 0
        rows.extend(gpu_rows(first, single.seconds))
        mwm, mwm_results = _run_check(f"MWM x{workers}", [*distrain, "launch", "-n", str(workers)], base,
                                      os.path.join(scratch, "mwm"), workers, timeout)
        rows += [mwm, arithmetic_row(mwm.check, mwm_results, os.path.join(scratch, "mwm"), first,
                                     os.path.join(scratch, "single"))]
        launcher = _horovod_launcher(workers)
        if launcher and _horovod_builds():
            horovod, horovod_results = _run_check(f"Horovod x{workers}", [*launcher, *distrain, "run"], base,
                                                  os.path.join(scratch, "horovod"), workers, timeout)
            rows += [horovod, arithmetic_row(horovod.check, horovod_results, os.path.join(scratch, "horovod"), first,
                                             os.path.join(scratch, "single"))]
        else:
            horovod_results = []
            rows.append(Row(f"Horovod x{workers}", SKIP, "Horovod with TensorFlow, or horovodrun/mpirun to start it, "
                                                         "is not installed"))
        rows.append(pinning_row([*mwm_results, *horovod_results]))
        rows.append(interconnect_row([*mwm_results, *horovod_results]))
        rows.extend(environment_rows(os.environ, first.get("cuda_version", "") if first else "", gpus))
    return rows


def arithmetic_row(check: str, results: list[dict], directory: str, reference: dict | None,
                   reference_directory: str) -> Row:
    """Whether the mode computed what the one-process run computed (selftest_arithmetic)."""
    return judge_arithmetic(check, results, reference, load_steps(directory), load_steps(reference_directory))


def _horovod_launcher(workers: int) -> list[str] | None:
    """horovodrun with Gloo where it is installed; else Open MPI's mpirun (images that ship Horovod without its
    launcher script)."""
    horovodrun = shutil.which("horovodrun", path=os.path.dirname(sys.executable)) or shutil.which("horovodrun")
    if horovodrun:
        return [horovodrun, "-np", str(workers), "--gloo"]
    mpirun = shutil.which("mpirun")
    if mpirun:
        return [mpirun, *(["--allow-run-as-root"] if os.geteuid() == 0 else []), "-np", str(workers)]
    return None


def _horovod_builds() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import horovod.tensorflow"], capture_output=True, timeout=120)
    return probe.returncode == 0


def judge_allocation(directory: str, env: Mapping[str, str]) -> list[Row]:
    """jobs/selftest.job: the checks its srun steps ran across the allocation, from what each rank wrote to
    DIR/<mode>/ and the step's log DIR/<mode>.log."""
    tasks = int(env.get("SLURM_NTASKS", "1") or 1)
    rows = []
    everyone: list[dict] = []
    first: dict = {}
    for mode, name in (("single", "single"), ("mwm", f"MWM x{tasks}"), ("horovod", f"Horovod x{tasks}")):
        out = os.path.join(directory, mode)
        log_path = os.path.join(directory, f"{mode}.log")
        if not os.path.isdir(out) and not os.path.exists(log_path):
            rows.append(Row(name, SKIP, "not run by the job"))
            continue
        log = _read(log_path)
        seconds = float(_read(os.path.join(directory, f"{mode}.seconds")) or 0)
        results = read_results(out)
        rows.append(judge_training(name, results, 1 if mode == "single" else tasks, log, seconds))
        if mode == "single":
            first = results[0] if results else {}
            rows.extend(gpu_rows(first or None))
        else:
            rows.append(arithmetic_row(name, results, out, first or None, os.path.join(directory, "single")))
            everyone.extend(results)
    rows.append(pinning_row(everyone))
    rows.append(interconnect_row(everyone))
    rows.extend(environment_rows(env, first.get("cuda_version", ""), len(first.get("gpus", []))))
    return rows


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


# ---- the report ----

def report(rows: list[Row]) -> str:
    width = max(len(r.check) for r in rows)
    lines = [f"{'check':<{width}}  status  {'time':>6}  detail"]
    lines += [f"{r.check:<{width}}  {r.status:<6}  {r.seconds:5.0f}s  {r.detail}" for r in rows]
    failed = [r.check for r in rows if r.status == FAIL]
    skipped = sum(r.status == SKIP for r in rows)
    verdict = (f"verdict: FAIL ({', '.join(failed)})" if failed else
               f"verdict: PASS ({sum(r.status == PASS for r in rows)} passed, {skipped} skipped)")
    return "\n".join([*lines, verdict])


def write_json(rows: list[Row], path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    with open(path + ".tmp", "w") as handle:
        json.dump([asdict(r) for r in rows], handle, indent=1)
    os.replace(path + ".tmp", path)


def failed(rows: list[Row]) -> bool:
    return any(r.status == FAIL for r in rows)

"""The device memory of one process as nvidia-smi shows it (NVML's per-process used memory),
sampled while it runs: the footprint section of scripts/bench (issue 13).

    run_sampled(argv, env, timeout) -> (returncode, stdout, stderr, peak_bytes, samples)

A thread polls nvmlDeviceGetComputeRunningProcesses for the child's pid every millisecond or
so (a call takes tens of microseconds); the peak is the largest value seen. Memory that a
process frees again within a millisecond can be missed: the figure is a lower bound, which
favours the uncached runs (their memory moves fastest), never the shim.
"""
import subprocess
import threading
import time


def _used_by(handles, pid, nvml):
    total = 0
    for h in handles:
        try:
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
        except nvml.NVMLError:
            continue
        for p in procs:
            if p.pid == pid and p.usedGpuMemory is not None:
                total += p.usedGpuMemory
    return total


def run_sampled(argv, env, timeout=600, interval_s=0.001):
    import pynvml as nvml  # nvidia-ml-py: on the GPU machine only
    nvml.nvmlInit()
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        peak = [0]
        samples = [0]
        done = threading.Event()

        def poll():
            while not done.is_set():
                used = _used_by(handles, child.pid, nvml)
                samples[0] += 1
                if used > peak[0]:
                    peak[0] = used
                time.sleep(interval_s)

        sampler = threading.Thread(target=poll, daemon=True)
        sampler.start()
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            done.set()
            sampler.join()
            raise
        done.set()
        sampler.join()
        return child.returncode, out, err, peak[0], samples[0]
    finally:
        nvml.nvmlShutdown()

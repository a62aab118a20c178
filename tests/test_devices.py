"""qkv.devices: the machine a result was measured on, and its memory kept for the next step."""

import platform
import subprocess
import sys

import pytest

from qkv.devices import cpu_identity


def test_two_cpus_a_virtual_machine_names_alike_are_told_apart(tmp_path):
    """The identity that kernel choices are kept under and results record: the name, and what differs behind it."""
    info = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: {model}\n" \
           "model name\t: Intel(R) Xeon(R) Processor\nstepping\t: 1\n\nprocessor\t: 1\nmodel name\t: other\n"
    identities = []
    for model, l3 in (("167", "491520K"), ("85", "8192K")):
        cpu = tmp_path / model
        for index, (level, size) in enumerate((("1", "48K"), ("2", "2048K"), ("3", l3))):
            (cpu / "cache" / f"index{index}").mkdir(parents=True)
            (cpu / "cache" / f"index{index}" / "level").write_text(level + "\n")
            (cpu / "cache" / f"index{index}" / "size").write_text(size + "\n")
        (cpu / "cpuinfo").write_text(info.format(model=model))
        identities.append(cpu_identity(cpu / "cpuinfo", cpu / "cache"))
    assert identities[0] == ("Intel(R) Xeon(R) Processor (cpu family 6, model 167, stepping 1, "
                             "L2 2048K, L3 491520K)")
    assert identities[1].startswith("Intel(R) Xeon(R) Processor (") and identities[0] != identities[1]
    # Without Linux's files: the name the platform gives.
    assert cpu_identity(tmp_path / "none", tmp_path / "none") == (platform.processor() or platform.machine())


_FREED = """
import os, sys, torch
from qkv.devices import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
elif sys.argv[1] == "start":  # every trainer starts through this
    from qkv.training.loop import start
    from qkv.recipes import MTTrainConfig
    start(MTTrainConfig())
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
before = resident()
x = torch.ones(64 << 20)  # 256 MB, written: resident
del x
print((resident() - before) >> 20)
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_a_freed_tensor_s_memory_is_kept_for_the_next_one_once_training_starts():
    """glibc hands a freed 256 MB tensor back to the kernel (the next one faults its pages in again);
    with keep_freed_memory, as every trainer's start sets it, the memory stays for reuse."""
    kept = {mode: int(subprocess.run([sys.executable, "-c", _FREED, mode], capture_output=True, text=True,
                                     check=True).stdout) for mode in ("none", "keep", "start")}
    assert kept["none"] < 64 and kept["keep"] > 192 and kept["start"] > 192, kept

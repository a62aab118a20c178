"""qkv.io: what every part needs from the outside world."""

import platform

from qkv.io import cpu_identity


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

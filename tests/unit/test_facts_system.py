"""OS, CPU, memory, disk, nvcc and Python parsers, on the real system.txt and on broken output."""

from pathlib import Path

import pytest

from gpufleet.errors import FactError
from gpufleet.facts import (parse_cpu_count, parse_disks, parse_mem, parse_nvcc, parse_os, parse_python_version)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module")
def system_parts() -> list[str]:
    """The real system.txt: nvcc, NVRM, uname+os-release, nproc+free+df, misc; separated by `---` lines."""
    return (FIXTURES / "real-h200" / "system.txt").read_text().split("---\n")


def test_real_nvcc(system_parts):
    assert parse_nvcc(system_parts[0], "h200") == "13.0.88"


def test_real_os_from_uname_and_os_release(system_parts):
    os_facts = parse_os(system_parts[2], "h200")
    assert os_facts.pretty_name == "Ubuntu 24.04.3 LTS"
    assert (os_facts.id, os_facts.version_id) == ("ubuntu", "24.04")
    assert (os_facts.kernel, os_facts.arch) == ("6.18.44-fc-v973-gpu", "x86_64")


def test_real_cpu_count(system_parts):
    assert parse_cpu_count(system_parts[3].splitlines()[0], "h200") == 16


def test_real_free_b(system_parts):
    mem = parse_mem(system_parts[3], "h200")
    assert (mem.total_bytes, mem.available_bytes) == (135128870912, 134608683008)


def test_real_df_b1(system_parts):
    [disk] = parse_disks(system_parts[3], "h200")
    assert (disk.path, disk.mount, disk.free_bytes, disk.total_bytes) == ("/", "/", 68702453760, 270553174016)


def test_os_section_form():
    text = ('KERNEL=6.1.0-28-amd64\nARCH=x86_64\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n'
            'VERSION_ID="12"\n')
    os_facts = parse_os(text, "d12")
    assert (os_facts.pretty_name, os_facts.id, os_facts.kernel) == ("Debian GNU/Linux 12 (bookworm)", "debian",
                                                                     "6.1.0-28-amd64")


def test_meminfo():
    mem = parse_mem("MemTotal:       131072000 kB\nMemAvailable:   65536000 kB\n", "h")
    assert (mem.total_bytes, mem.available_bytes) == (131072000 * 1024, 65536000 * 1024)


def test_disk_section_names_the_asked_path():
    text = ("path=/root/models/qwen\nchecked=/root\n"
            "Filesystem         1-blocks        Used   Available Capacity Mounted on\n"
            "/dev/vda       270553174016 23192780800 85751513088      22% /\n")
    [disk] = parse_disks(text, "h")
    assert (disk.path, disk.mount, disk.free_bytes) == ("/root/models/qwen", "/", 85751513088)


def test_disk_mount_with_spaces_and_wrapped_filesystem():
    text = ("Filesystem 1B-blocks Used Available Use% Mounted on\n/dev/mapper/very-long-volume-name\n"
            "              1000 400 600  40% /mnt/my disk\n")
    [disk] = parse_disks(text, "h")
    assert (disk.mount, disk.free_bytes, disk.total_bytes) == ("/mnt/my disk", 600, 1000)


def test_disk_without_row_names_the_path():
    text = "path=/data\nchecked=/data\ndf: /data: Input/output error\n"
    with pytest.raises(FactError, match="could not read disk space on host h: df gave no row for /data: df: /data"):
        parse_disks(text, "h")


def test_no_paths_no_disks():
    assert parse_disks("", "h") == []


@pytest.mark.parametrize("parser, text, detail", [
    (parse_os, "gpufleet: no /etc/os-release\n", "could not read OS release on host h: no /etc/os-release"),
    (parse_cpu_count, "nproc: command not found\n", "could not read CPU count on host h: unexpected nproc output"),
    (parse_cpu_count, "", "unexpected nproc output ''"),
    (parse_mem, "grep: /proc/meminfo: No such file or directory\n", "could not read memory on host h: no MemTotal"),
    (parse_disks, "garbage\n", "could not read disk space on host h: no df rows"),
    (parse_nvcc, "gpufleet: nvcc not found (PATH, /usr/local/cuda/bin)\n", "could not read nvcc version on host h: "
                                                                           "nvcc not found"),
    (parse_python_version, "gpufleet: venv missing: /opt/venv\n", "could not read Python version on host h: "
                                                                  "venv missing: /opt/venv"),
    (parse_python_version, "", "unexpected output ''"),
])
def test_broken(parser, text, detail):
    with pytest.raises(FactError) as err:
        parser(text, "h")
    assert detail in str(err.value)


def test_python_version_after_a_warning():
    assert parse_python_version("some warning\n3.12.3\n", "h") == "3.12.3"

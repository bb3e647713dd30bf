"""What an operator sees of a multi-GB download: lines at each tenth in logs, a bar on a terminal."""

from __future__ import annotations

import io

from rich.console import Console

from gpufleet.cli import downloads

URL = "https://user:tok@example.org/whl/flashinfer_jit_cache-0.6.5%2Bcu130-cp39-abi3-manylinux_2_28_x86_64.whl"
GB = 1_700_000_000


def test_lines_at_each_tenth_once_with_the_file_name_and_no_credentials():
    out = io.StringIO()
    lines = downloads.reporter(Console(file=out, width=200), live_view=True)
    for done in range(0, GB + 1, GB // 40):
        lines(URL, done, GB)
    lines(URL, GB, GB)
    text = out.getvalue().splitlines()
    assert text[0] == "fetching flashinfer_jit_cache-0.6.5+cu130-cp39-abi3-manylinux_2_28_x86_64.whl: 0% of 1.7 GB"
    assert [t.rsplit(": ", 1)[1] for t in text] == [f"{p}% of 1.7 GB" for p in range(0, 101, 10)]
    assert "tok" not in out.getvalue()


def test_small_files_say_nothing_and_unknown_sizes_say_how_much_so_far():
    out = io.StringIO()
    lines = downloads.DownloadLines(Console(file=out, width=200), every=0)
    lines(URL, 10, 1000)
    assert out.getvalue() == ""
    lines(URL, 12_000_000, None)
    assert out.getvalue().endswith(": 12.0 MB so far\n")


def test_a_terminal_gets_a_bar_that_goes_away_when_done():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    bars = downloads.reporter(console)
    assert isinstance(bars, downloads.DownloadBars)
    bars(URL, 0, GB)
    assert bars._progress is not None
    bars(URL, GB, GB)
    assert bars._progress is None and "fetching flashinfer_jit_cache" in out.getvalue()

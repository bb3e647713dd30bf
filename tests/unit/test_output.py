"""Host-prefixed output: whole lines only, even when chunks split lines."""

from gpufleet.engine.output import HostLines


def test_chunks_become_whole_prefixed_lines():
    got = []
    lines = HostLines("gpu1", sink=got.append)
    lines.feed("Collecting tor")
    lines.feed("ch\nInstalling\r\npartial")
    assert got == ["[gpu1] Collecting torch", "[gpu1] Installing"]
    lines.flush()
    assert got[-1] == "[gpu1] partial"

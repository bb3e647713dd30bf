"""The sgl-kernel build key: stable for the same inputs, different when any input changes; the local cache."""

from dataclasses import replace

import pytest

from gpufleet.config.series import patches_digest, series_names
from gpufleet.kernel.buildcache import BuildInputs, LocalCache, Record, fetch_to_cache, push_from_cache, record_path
from gpufleet.testing.session import FakeSession

BASE = BuildInputs(torch="2.12.0.dev20260307+cu130", cuda="13.0", arch="12.0a", source_tree="a" * 40,
                   patches="p" * 64, fp4=True, extra_cmake_args=(), compile_threads=1)


def test_key_is_stable():
    assert BASE.key() == replace(BASE).key() == BuildInputs(**BASE.__dict__).key()
    assert len(BASE.key()) == 64


@pytest.mark.parametrize("change", [
    {"torch": "2.12.0.dev20260308+cu130"}, {"cuda": "13.1"}, {"arch": "10.0a"}, {"source_tree": "b" * 40},
    {"patches": "q" * 64}, {"fp4": False}, {"extra_cmake_args": ("-DENABLE_CCACHE=ON",)}, {"compile_threads": 2},
])
def test_key_changes_with_each_input(change):
    assert replace(BASE, **change).key() != BASE.key()


def test_patch_digest_covers_series_and_patch_bytes(tmp_path):
    empty = patches_digest(tmp_path)
    assert patches_digest(None) == empty
    (tmp_path / "series").write_text("# site patches\n0001-policy.patch\n\n0002-cccl.patch -p1\n")
    (tmp_path / "0001-policy.patch").write_text("one\n")
    (tmp_path / "0002-cccl.patch").write_text("two\n")
    assert series_names(tmp_path) == ["0001-policy.patch", "0002-cccl.patch"]
    first = patches_digest(tmp_path)
    assert first != empty and patches_digest(tmp_path) == first
    (tmp_path / "0002-cccl.patch").write_text("two!\n")
    second = patches_digest(tmp_path)
    assert second != first
    (tmp_path / "series").write_text("0002-cccl.patch\n0001-policy.patch\n")
    assert patches_digest(tmp_path) not in (first, second)
    (tmp_path / "unlisted.patch").write_text("ignored\n")
    assert patches_digest(tmp_path) == patches_digest(tmp_path)


def test_local_cache_roundtrip(tmp_path):
    cache = LocalCache(tmp_path / "cache")
    assert cache.wheel("k" * 64) is None
    src = tmp_path / "sgl_kernel-0.3.21-cp310-abi3-linux_x86_64.whl"
    src.write_bytes(b"wheel")
    rec = Record(key="k" * 64, inputs={"host": "gpu1"}, wheel="/var/lib/x/" + src.name, archs=["sm_120a"], fp4=True)
    stored = cache.store(rec, src)
    assert cache.wheel("k" * 64) == stored and stored.read_bytes() == b"wheel"
    assert cache.record("k" * 64) == rec
    assert Record.from_json("not json") is None


def test_a_hosts_build_is_fetched_into_the_cache_and_handed_to_another_host(tmp_path):
    key = "k" * 64
    cache = LocalCache(tmp_path / "cache")
    built = FakeSession(name="gpu1")
    assert fetch_to_cache(built, key, cache) is None  # no record on the host: nothing built there
    rec = Record(key=key, inputs={}, wheel="/var/lib/x/sgl_kernel-0.3.21-cp310-abi3-linux_x86_64.whl")
    built.files = {record_path(key): rec.to_json().encode(), rec.wheel: b"wheel"}
    stored = fetch_to_cache(built, key, cache)
    assert stored.read_bytes() == b"wheel" and cache.record(key) == rec
    other = FakeSession(name="gpu2")
    remote = push_from_cache(other, key, cache)
    assert other.files[remote] == b"wheel" and other.steps == ["prepare cache upload"]

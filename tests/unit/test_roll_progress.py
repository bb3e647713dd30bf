"""The live roll view follows the roll's own lines: current step and time per host."""

from gpufleet.cli.progress import RollProgress


def test_host_lines_move_the_current_step_and_time():
    now = [100.0]
    progress = RollProgress(["gpu1", "gpu2"], clock=lambda: now[0])
    progress.line("batch 1/2: gpu1")
    assert progress.rows["gpu1"].state == "waiting" and progress.seconds("gpu1") is None
    progress.line("[gpu1] torch: install torch 2.12.0.dev20260307+cu130")
    now[0] = 130.0
    progress.line("[gpu1] sgl-kernel: build sgl-kernel 0.3.21 for 12.0a")
    assert progress.rows["gpu1"].step.startswith("sgl-kernel: build")
    assert progress.seconds("gpu1") == 30
    progress.finish("gpu1", "ok")
    now[0] = 500.0
    assert progress.seconds("gpu1") == 30 and progress.rows["gpu1"].state == "ok"
    progress.line("[gpu9] not in this roll")
    assert set(progress.rows) == {"gpu1", "gpu2"}


def test_table_has_a_row_per_host():
    progress = RollProgress(["gpu1", "gpu2"], clock=lambda: 0.0)
    progress.line("[gpu2] health: waiting for /health [503]")
    table = progress.table()
    assert table.row_count == 2
    assert [c.header for c in table.columns] == ["host", "state", "step", "s"]

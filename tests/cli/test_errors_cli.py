"""The command line words kvcore's errors with its own flags (a Python caller gets parameters)."""

import pytest

import kvcore.runtime.allocation
from kvcore.cli import main
from kvcore.cli.inputs import FLAG_NAMES
from tests.cli.conftest import full_entry

ONE_LAYER = {"l0": full_entry()}  # 64.00 KiB per block of 16 tokens


def error_line(run_cli, *argv):
    status, out, err = run_cli(*argv)
    assert status == 1 and out == ""
    assert err.startswith("kvcore: error: ") and err.count("\n") == 1
    return err.removeprefix("kvcore: error: ").rstrip("\n")


#: Stands in an argv for the path of a spec file of ONE_LAYER (written per test).
SPECS = "<spec-file-of-ONE_LAYER>"


#: How every error of too little memory ends on the command line.
MORE_MEMORY = "give the KV cache more memory (--memory, or a higher utilization)"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(
            "--model meta-llama/Llama-3.1-8B --memory 1GiB --max-model-len 131072",
            "one request of 131072 tokens needs 16.00 GiB of KV cache (8192 blocks of 2.00 MiB) but only "
            "1.00 GiB is available (512 blocks of 2.00 MiB); the largest max_model_len that fits is 8192; "
            f"lower --max-model-len to 8192 or {MORE_MEMORY}",
            id="one request over the memory",
        ),
        pytest.param(
            f"--specs {SPECS} --memory 1MiB --max-model-len 512 --num-blocks 8",
            "one request of 512 tokens needs 2.00 MiB of KV cache (32 blocks of 64.00 KiB) but "
            "--num-blocks 8 holds 512.00 KiB; the largest max_model_len that fits is 128; "
            "lower --max-model-len to 128 or raise --num-blocks to at least 32",
            id="one request over a forced block count",
        ),
        pytest.param(
            f"--specs {SPECS} --memory 1MiB --max-model-len 16 --num-blocks 20",
            "--num-blocks 20 needs 1.25 MiB (20 blocks of 64.00 KiB) but only 1.00 MiB is available; "
            f"at most 16 blocks fit: lower --num-blocks or {MORE_MEMORY}",
            id="a forced block count over the memory",
        ),
    ],
)
def test_plan_errors_name_the_flags(run_cli, spec_file, argv, expected):
    argv = [spec_file(ONE_LAYER) if arg == SPECS else arg for arg in argv.split()]
    assert error_line(run_cli, "plan", *argv) == expected


def test_errors_of_one_rank_name_the_rank_and_the_flags(run_cli):
    line = error_line(
        run_cli, "plan", "--model", "meta-llama/Llama-3.1-8B", "--memory", "1GiB", "--max-model-len", "1024",
        "--tp", "2", "--pp", "2", "--num-blocks", "100000",
    )  # fmt: skip
    assert line.startswith("rank 0 (pp stage 0, tp rank 0): --num-blocks 100000 needs ")
    assert line.endswith(f"lower --num-blocks or {MORE_MEMORY}")


def test_a_failed_allocation_names_the_flags(run_cli, spec_file, monkeypatch):
    def refuse(nbytes, device):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(kvcore.runtime.allocation, "empty_bytes", refuse)
    line = error_line(
        run_cli, "allocate", "--specs", spec_file(ONE_LAYER), "--memory", "1MiB", "--max-model-len", "16"
    )
    assert line.startswith("allocating the KV cache on cpu failed after 0 B of 1.00 MiB in 1 allocation(s) ")
    assert line.endswith("is free now: plan for less memory (a lower utilization or --memory)")


def test_the_names_errors_use_are_options_of_plan(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    options = capsys.readouterr().out
    for flag in (FLAG_NAMES.max_model_len, FLAG_NAMES.num_blocks, FLAG_NAMES.memory):
        assert f"{flag} " in options


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


_LLAMA_RUN = (
    "--model", "meta-llama/Llama-3.2-1B", "--memory", "1GiB", "--max-model-len", "4096",
    "--requests", "8", "--prompt-len", "100", "--output-len", "10", "--policies", "shared_buffer",
)  # fmt: skip


@pytest.mark.parametrize(
    ("command", "target"),
    [("simulate", "kvcore.cli.simulate.simulate_candidates"), ("tune", "kvcore.tuning.search.tune")],
)
def test_ctrl_c_ends_with_one_line_and_status_130(run_cli, monkeypatch, command, target):
    """Ctrl-C in a long simulate or tune: one line and the shell's status for SIGINT, no traceback
    (issue 38: 27 lines of traceback)."""
    monkeypatch.setattr(target, _interrupt)
    status, _, err = run_cli(command, *_LLAMA_RUN)
    assert status == 130
    assert err.splitlines()[-1] == "kvcore: interrupted" and "Traceback" not in err

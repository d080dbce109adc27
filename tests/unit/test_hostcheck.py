"""The host doctor's judgements and the host facts they read, with plain values and files."""

from __future__ import annotations

from pathlib import Path

from runner.engines.docker import LABEL_HOST, LABEL_PID
from runner.prepare.host import NumaNode, numa_nodes
from runner.prepare.hostcheck import (
    MIN_OPEN_FILES,
    is_orphan,
    is_vllm_server,
    judge_disk,
    judge_driver,
    judge_numa,
    judge_open_files,
    judge_other_engines,
    server_port,
)
from runner.prepare.torchstack import FIX, TorchStack, verdict
from runner.prepare.validate import MachineMemory


def test_open_files_below_what_vllm_wants_is_a_warning_with_the_command() -> None:
    assert judge_open_files(MIN_OPEN_FILES, MIN_OPEN_FILES).status == "ok"
    raisable = judge_open_files(1024, 1048576)
    assert raisable.status == "warn" and f"ulimit -n {MIN_OPEN_FILES}" in raisable.fix
    capped = judge_open_files(20000, 20000)
    assert "hard limit" in capped.fix


def test_a_driver_older_than_the_profile_fails_only_when_the_run_uses_the_gpu() -> None:
    """seed 004: 570.144 failed with CUDA error 804 where the profile needs 595.58.03."""
    assert judge_driver("595.58.03", "595.58.03", "rtx5090").status == "ok"
    old = judge_driver("570.144", "595.58.03", "rtx5090")
    assert old.status == "fail" and "595.58.03" in old.fix
    assert judge_driver("570.144", "595.58.03", "rtx5090", needed=False).status == "warn"


def test_disk_below_the_need_is_named_with_both_figures() -> None:
    row = judge_disk("image (Docker root)", Path("/var/lib/docker"), 12.5, 30, needed=True)
    assert row.status == "fail" and "12.5 GiB free" in row.found and "30 GiB" in row.found
    assert judge_disk("results", Path("/r"), 2.0, 1.0, needed=True).status == "ok"


def test_numa_figures_come_with_the_growth_caveat_and_warn_above_node_0() -> None:
    nodes = [NumaNode(0, 8.7, 6.5), NumaNode(1, 15.3, 12.0)]
    machine = MachineMemory(24.0)
    fits = judge_numa(nodes, machine, 2.0)
    assert (
        fits.status == "ok" and "node 0: 6.5/8.7 GiB free" in fits.found and "grows" in fits.found
    )
    assert judge_numa(nodes, machine, 7.0).status == "warn"
    assert judge_numa(nodes, machine, None).status == "ok"


def test_an_orphan_is_a_container_of_this_host_whose_runner_is_gone() -> None:
    def alive(pid: int) -> bool:
        return pid == 10

    assert is_orphan({LABEL_PID: "11", LABEL_HOST: "box"}, "box", alive)
    assert not is_orphan({LABEL_PID: "10", LABEL_HOST: "box"}, "box", alive)
    assert not is_orphan({LABEL_PID: "11", LABEL_HOST: "other"}, "box", alive)
    assert not is_orphan({"runner.run_id": "r"}, "box", alive)


def test_numa_nodes_are_read_from_the_kernels_node_files(tmp_path: Path) -> None:
    for index, (total, free) in enumerate([(9121348, 6795264), (16082760, 8517072)]):
        folder = tmp_path / f"node{index}"
        folder.mkdir()
        (folder / "meminfo").write_text(
            f"Node {index} MemTotal:       {total} kB\nNode {index} MemFree:        {free} kB\n"
        )
    (tmp_path / "online").write_text("0-1\n")
    nodes = numa_nodes(tmp_path)
    assert [node.index for node in nodes] == [0, 1]
    assert round(nodes[0].total_gib, 1) == 8.7 and round(nodes[1].free_gib, 1) == 8.1


def test_companions_that_do_not_load_are_named_with_the_fix() -> None:
    """The errors are the ones torchvision 0.29.1 and torchaudio 2.11.1 raise on torch 2.13."""
    fine = TorchStack("2.13.0+cpu", {}, {})
    assert verdict(fine, "/venv/bin/python") is None
    broken = TorchStack(
        "2.13.0+cpu",
        {"torchvision": "0.29.1", "torchaudio": "2.11.1"},
        {
            "torchvision": "RuntimeError: operator torchvision::nms does not exist",
            "torchaudio": "OSError: Could not load this library: _torchaudio.so",
        },
    )
    message = verdict(broken, "/venv/bin/python")
    assert message is not None and "\n" not in message
    assert "torchvision 0.29.1" in message and "torchaudio 2.11.1" in message
    assert f"/venv/bin/python -m {FIX}" in message and "scripts/setup.sh" in message


def test_vllm_servers_are_told_from_other_processes_by_their_argv() -> None:
    module = ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "8300"]
    assert is_vllm_server(module) and server_port(module) == 8300
    serve = ["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "Qwen/Qwen3-0.6B", "--port=9000"]
    assert is_vllm_server(serve) and server_port(serve) == 9000
    assert server_port(["vllm", "serve", "m"]) == 8000  # vLLM's default port
    assert not is_vllm_server(["vllm", "bench", "serve", "--port", "8300"])
    assert not is_vllm_server(["python", "-m", "runner", "backend=external"])


def test_other_vllm_servers_are_a_warning_naming_pid_and_port_only() -> None:
    assert judge_other_engines([]).status == "ok"
    seen = judge_other_engines([(4242, 8300), (4343, 8000)])
    assert seen.status == "warn" and seen.found == "pid 4242 (port 8300), pid 4343 (port 8000)"
    assert "wake" in seen.fix and "GPU" in seen.fix

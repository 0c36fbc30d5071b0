"""Hostlists, task counts and the MWM cluster from Slurm step variables (no TensorFlow)."""

import json

import pytest

from entrypoint.errors import ConfigError
from entrypoint.plan import detect
from entrypoint.slurm import expand_hostlist, expand_tasks_per_node, port_base, read_step, worker_addresses


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("n1", ["n1"]),
        ("n[1-3,7]", ["n1", "n2", "n3", "n7"]),
        ("gpu[001-010]", [f"gpu{i:03d}" for i in range(1, 11)]),
        ("a[1-2]-ib,b3", ["a1-ib", "a2-ib", "b3"]),
        ("n[9-10]", ["n9", "n10"]),  # Slurm's order, not string order (TF's resolver puts n10 first)
        ("n9,n10", ["n9", "n10"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ],
)
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("bad", ["n[1-3", "n1-3]", "n[3-1]", "n[a-b]"])
def test_malformed_hostlist_is_refused(bad):
    with pytest.raises(ConfigError, match="host list"):
        expand_hostlist(bad)


@pytest.mark.parametrize(
    ("text", "counts"),
    [("4", [4]), ("2(x3),1", [2, 2, 2, 1]), ("3,1", [3, 1]), ("2(x2)", [2, 2])],
)
def test_expand_tasks_per_node(text, counts):
    assert expand_tasks_per_node(text) == counts


def step_env(nodes, tasks, rank, node, local, ntasks, **extra):
    env = {
        "SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": nodes,
        "SLURM_STEP_TASKS_PER_NODE": tasks, "SLURM_PROCID": str(rank), "SLURM_NODEID": str(node),
        "SLURM_LOCALID": str(local), "SLURM_STEP_NUM_TASKS": str(ntasks),
    }
    env.update(extra)
    return env


def test_numeric_host_order_gives_each_rank_its_own_host():
    step = read_step(step_env("n[9-10]", "1(x2)", 1, 1, 0, 2))
    assert worker_addresses(step, 30000) == ["n9:30000", "n10:30001"]


def test_ports_distinct_per_rank_even_when_nodes_share_a_host():
    step = read_step(step_env("n[1-2]", "2(x2)", 3, 1, 1, 4))
    addresses = worker_addresses(step, 30000)
    assert addresses == ["n1:30000", "n1:30001", "n2:30002", "n2:30003"]
    assert len({a.split(":")[1] for a in addresses}) == 4


def test_port_base_differs_between_jobs_and_respects_override():
    a = read_step(step_env("n1", "2", 0, 0, 0, 2, SLURM_JOB_ID="100"))
    b = read_step(step_env("n1", "2", 0, 0, 0, 2, SLURM_JOB_ID="101"))
    assert port_base(a, 2, None) != port_base(b, 2, None)
    assert 20000 <= port_base(a, 2, None) <= 32768 - 2  # below the ephemeral range
    assert port_base(a, 2, "40000") == 40000
    with pytest.raises(ConfigError, match="DISTRAIN_PORT_BASE"):
        port_base(a, 2, "80")


def test_cyclic_layout_is_computed_not_guessed():
    # 2 nodes x 2 tasks, cyclic: rank 0 -> n1, 1 -> n2, 2 -> n1, 3 -> n2
    step = read_step(step_env("n[1-2]", "2(x2)", 1, 1, 0, 4, SLURM_DISTRIBUTION="cyclic"))
    assert worker_addresses(step, 30000) == ["n1:30000", "n2:30001", "n1:30002", "n2:30003"]


def test_uneven_cyclic_layout():
    step = read_step(step_env("n[1-2]", "3,1", 3, 0, 2, 4, SLURM_DISTRIBUTION="cyclic"))
    assert [a.split(":")[0] for a in worker_addresses(step, 1)] == ["n1", "n2", "n1", "n1"]


def test_variables_that_contradict_the_layout_are_refused():
    # block layout puts rank 1 on n1, but the task says it is on node 1
    with pytest.raises(ConfigError, match="inconsistent Slurm variables"):
        read_step(step_env("n[1-2]", "2(x2)", 1, 1, 0, 4))


def test_unsupported_distribution_is_refused():
    with pytest.raises(ConfigError, match="plane"):
        read_step(step_env("n[1-2]", "2(x2)", 0, 0, 0, 4, SLURM_DISTRIBUTION="plane=2"))


@pytest.mark.parametrize(
    ("nodes", "tasks", "ntasks", "message"),
    [
        ("n[1-2]", "2", 2, "2 nodes .* 1 task counts"),
        ("n1", "2", 3, "SLURM_STEP_NUM_TASKS=3"),
    ],
)
def test_inconsistent_counts(nodes, tasks, ntasks, message):
    with pytest.raises(ConfigError, match=message):
        read_step(step_env(nodes, tasks, 0, 0, 0, ntasks))


@pytest.mark.parametrize(
    ("nodes", "tasks", "ntasks", "rank", "node", "local", "gpus", "device"),
    [
        ("n1", "1", 1, 0, 0, 0, ["0"], "0"),                  # 1x1
        ("n1", "4", 4, 2, 0, 2, ["0", "1", "2", "3"], "2"),   # 1x4, --gres=gpu:4: pick by local rank
        ("n[1-2]", "2(x2)", 4, 3, 1, 1, ["0", "1"], "1"),    # 2x2
        ("n[1-2]", "4(x2)", 8, 5, 1, 1, ["1"], "1"),         # 2x4 --gpus-per-task=1: Slurm narrowed it
        ("n[1-2]", "4(x2)", 8, 5, 1, 1, [], None),            # no GPUs: CPU, no nvidia-smi
    ],
)
def test_mwm_matrix(nodes, tasks, ntasks, rank, node, local, gpus, device):
    env = step_env(nodes, tasks, rank, node, local, ntasks, DISTRAIN_MODE="mwm")
    plan = detect(env, gpus=gpus)
    assert (plan.mode, plan.rank, plan.size, plan.local_rank) == ("mwm", rank, ntasks, local)
    assert plan.devices == ((device,) if device else ())
    config = json.loads(dict(plan.env_set)["TF_CONFIG"])
    assert config["task"] == {"type": "worker", "index": rank}
    assert len(config["cluster"]["worker"]) == ntasks


def test_too_few_gpus_for_the_tasks_on_a_node():
    env = step_env("n1", "4", 0, 0, 0, 4, DISTRAIN_MODE="mwm")
    with pytest.raises(ConfigError, match="4 tasks on this node share 2 visible GPUs, which do not split evenly"):
        detect(env, gpus=["0", "1"])


def test_a_requeued_run_gets_other_ports():
    first = read_step(step_env("n1", "2", 0, 0, 0, 2))
    again = read_step(step_env("n1", "2", 0, 0, 0, 2, SLURM_RESTART_COUNT="1"))
    assert port_base(first, 2, None) != port_base(again, 2, None)


@pytest.mark.parametrize(
    ("nodes", "tasks", "ntasks", "rank", "node", "local", "gpus", "devices"),
    [
        ("n[1-2]", "1(x2)", 2, 1, 1, 0, ["0", "1", "2", "3"], ("0", "1", "2", "3")),  # one task per node: all GPUs
        ("n1", "2", 2, 1, 0, 1, ["0", "1", "2", "3"], ("2", "3")),                      # 4 GPUs, 2 tasks: a block each
        ("n1", "2", 2, 0, 0, 0, ["4", "5", "6", "7"], ("4", "5")),                      # Slurm's ids, not positions
        ("n1", "4", 4, 3, 0, 3, ["0", "1", "2", "3"], ("3",)),                          # one each
    ],
)
def test_a_nodes_gpus_are_shared_evenly_among_its_tasks(nodes, tasks, ntasks, rank, node, local, gpus, devices):
    plan = detect(step_env(nodes, tasks, rank, node, local, ntasks, DISTRAIN_MODE="mwm"), gpus=gpus)
    assert plan.devices == devices and dict(plan.env_set)["CUDA_VISIBLE_DEVICES"] == ",".join(devices)


def test_an_uneven_gpu_split_or_several_gpus_per_horovod_process_is_refused():
    with pytest.raises(ConfigError, match="3 tasks on this node share 4 visible GPUs, which do not split evenly"):
        detect(step_env("n1", "3", 0, 0, 0, 3, DISTRAIN_MODE="mwm"), gpus=["0", "1", "2", "3"])
    env = step_env("n1", "2", 0, 0, 0, 2, DISTRAIN_MODE="horovod", PMIX_RANK="0")
    with pytest.raises(ConfigError, match="Horovod drives one GPU per process"):
        detect(env, gpus=["0", "1", "2", "3"])

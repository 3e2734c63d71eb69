"""Which launcher started us, from hand-made environments (the real ones: tests/test_hpc.py)."""

from __future__ import annotations

import pytest

from deepjimu.errors import JimuError
from deepjimu.launchers import Launcher, detect, expand_hostlist, job_port, tasks_per_node

# an srun task: rank 1 of a 4-task step on two nodes, as Slurm 22.05 sets it (trimmed)
SRUN = {
    "SLURM_JOB_ID": "4711",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURMD_NODENAME": "gpu08",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
}
# the batch step of `sbatch -n 3`: a rank and the job's tasks, but no step
BATCH = {"SLURM_JOB_ID": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "3",
         "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "vm"}  # fmt: skip
# a rank of OpenMPI's mpirun -np 2 on one machine
OMPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "OMPI_MCA_ess_base_jobid": "367525889"}  # fmt: skip
# srun -n 1
SRUN_1 = {**SRUN, "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1", "SLURM_PROCID": "0",
          "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_LOCALID": "0"}  # fmt: skip
TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400",
            "TORCHELASTIC_RUN_ID": "x"}  # fmt: skip


def test_an_srun_task_joins_at_the_step_s_first_node_on_a_port_of_its_job() -> None:
    p = detect(SRUN)
    assert p.launcher == Launcher.SLURM and p.joined
    assert (p.rank, p.world, p.local_rank, p.local_world) == (3, 4, 1, 2)
    assert (p.master_addr, p.master_port) == ("gpu07", 24711)
    assert p.torch_env() == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                             "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "gpu07",
                             "MASTER_PORT": "24711"}  # fmt: skip
    assert p.train_command == "srun -n 4 jimu train"
    given = detect({**SRUN, "MASTER_ADDR": "head", "MASTER_PORT": "1234"})
    assert (given.master_addr, given.master_port) == ("head", 1234)
    # a later step of the job at once: a port of its own
    assert detect({**SRUN, "SLURM_STEP_ID": "1"}).master_port == 24712
    # uneven nodes: this node's own count
    uneven = {**SRUN, "SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURMD_NODENAME": "gpu07",
              "SLURM_PROCID": "2", "SLURM_LOCALID": "2"}  # fmt: skip
    assert detect(uneven).local_world == 3


@pytest.mark.parametrize(
    "env",
    [
        BATCH,  # jimu train --workers N inside sbatch: jimu starts its workers
        SRUN_1,
        {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "vm"},  # an salloc shell
        {**OMPI, "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"},  # mpirun -np 1
        {},
    ],
    ids=["batch-step", "srun-n1", "salloc", "mpirun-np1", "none"],
)
def test_one_task_or_no_step_is_jimu_s_own_launch(env: dict[str, str]) -> None:
    assert detect(env).launcher == Launcher.LOCAL


def test_mpi_ranks_join_on_this_machine_or_at_master_addr() -> None:
    p = detect(OMPI)
    assert (p.launcher, p.rank, p.world, p.local_rank, p.local_world) == (Launcher.MPI, 1, 2, 1, 2)
    assert (p.master_addr, p.master_port) == ("127.0.0.1", 20000 + 367525889 % 20000)
    pmi = detect({"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0",
                  "MPI_LOCALNRANKS": "2", "MASTER_PORT": "29500"})  # fmt: skip
    assert (pmi.launcher, pmi.rank, pmi.world, pmi.master_port) == (Launcher.MPI, 0, 2, 29500)
    across = {**OMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    with pytest.raises(JimuError, match=r"mpirun -x MASTER_ADDR=<host> \(ranks: 2, on this"):
        detect(across)
    assert detect({**across, "MASTER_ADDR": "n0"}).master_addr == "n0"


def test_the_nearest_launcher_wins() -> None:
    # torchrun under srun: torchrun's ranks
    p = detect({**SRUN, **TORCHRUN})
    assert (p.launcher, p.rank, p.world) == (Launcher.TORCHRUN, 1, 2)
    assert p.torch_env() == {}, "torchrun set them itself"
    # mpirun inside an allocation starts its daemons with srun: the MPI rank, not the daemon's
    assert detect({**SRUN, **OMPI}).launcher == Launcher.MPI
    # srun --mpi=pmi2 sets both: the same numbers
    assert detect({**SRUN, "PMI_RANK": "3", "PMI_SIZE": "4"}).launcher == Launcher.SLURM
    # RANK / WORLD_SIZE from any other launcher
    plain = {k: v for k, v in TORCHRUN.items() if k != "TORCHELASTIC_RUN_ID"}
    assert detect(plain).launcher == Launcher.TORCHRUN
    # exported for torch: deciding again gives the same
    p = detect(SRUN)
    assert detect({**SRUN, **p.torch_env()}) == p


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {**SRUN, "SLURM_PROCID": "x"},
            r"SLURM_PROCID must be a whole number \(SLURM_PROCID: 'x'\)",
        ),
        ({**SRUN, "SLURM_PROCID": "4"}, r"slurm gave rank 4 of 4 \(srun's SLURM_STEP_NUM_TASKS\)"),
        ({**SRUN, "SLURM_STEP_NODELIST": "gpu[07-08"}, "unbalanced brackets"),
        ({**SRUN, "MASTER_PORT": "70000"}, r"MASTER_PORT must be a TCP port, 1 to 65535"),
        ({**SRUN, "SLURM_STEP_TASKS_PER_NODE": "2(y2)"}, r"bad part '2\(y2\)'"),
    ],
)
def test_a_bad_launcher_variable_is_one_line(env: dict[str, str], message: str) -> None:
    with pytest.raises(JimuError, match=message) as e:
        detect(env)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("vm", ["vm"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
        ("r[1-2]-n[08-09]", ["r1-n08", "r1-n09", "r2-n08", "r2-n09"]),
        ("gpu[9-10]", ["gpu9", "gpu10"]),
    ],
)
def test_slurm_host_lists_expand_as_scontrol_does(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["n[3-1]", "n[a-b]", "n]1[", "n[1-2"])
def test_a_bad_host_list_is_refused(text: str) -> None:
    with pytest.raises(JimuError, match="Slurm host list"):
        expand_hostlist(text)


def test_tasks_per_node_and_job_ports() -> None:
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("4") == [4]
    assert job_port("4711") == 24711 and job_port("24711") == 24711
    assert 20000 <= job_port("namespace-abc") < 40000
    assert job_port("namespace-abc") == job_port("namespace-abc"), "the same on every rank"

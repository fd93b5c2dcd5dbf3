"""Parameter servers on real MPI processes: 2 servers + 2 workers in one mpiexec job."""
import subprocess
from pathlib import Path

from reference_impl.comm.mpi import mpiexec_command

ROOT = Path(__file__).resolve().parent.parent


def test_two_servers_two_workers_match_one_process_for_every_optimizer():
    run = subprocess.run(mpiexec_command(4, str(ROOT / "tests" / "mpi_programs" / "ps_train.py")),
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "OK 24 comparisons on 4 ranks" in run.stdout, run.stdout + run.stderr

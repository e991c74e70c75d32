"""The tests. Whatever a run makes in the temporary folder (``tempfile``'s default place, and
pytest's ``tmp_path`` under it) lies in one folder of the run's own, removed when the run's
process ends: a run leaves no agent homes, workspaces or sockets behind in ``/tmp``."""

import atexit
import shutil
import tempfile

_RUN_FOLDER = tempfile.mkdtemp(prefix="hermes-acp-tests-")
tempfile.tempdir = _RUN_FOLDER
atexit.register(shutil.rmtree, _RUN_FOLDER, ignore_errors=True)

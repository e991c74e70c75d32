"""The tests. Whatever a run makes in the temporary folder (``tempfile``'s default place, and
pytest's ``tmp_path`` under it), and whatever the processes it starts make there (``TMPDIR``:
agents' saved web pages, their servers' files), lies in one folder of the run's own, removed
when the run's process ends: a run leaves no agent homes, workspaces or sockets behind in
``/tmp``."""

import atexit
import os
import shutil
import tempfile

_RUN_FOLDER = tempfile.mkdtemp(prefix="hermes-acp-tests-")
os.chmod(_RUN_FOLDER, 0o711)  # a test that drops to another user (as root) still reaches its own folder
tempfile.tempdir = os.environ["TMPDIR"] = _RUN_FOLDER
atexit.register(shutil.rmtree, _RUN_FOLDER, ignore_errors=True)

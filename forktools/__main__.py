import sys

if sys.version_info < (3, 11):  # before any import that needs 3.11 (tomllib)
    sys.exit(
        f"python -m forktools needs Python 3.11 or newer; {sys.executable} is "
        f"{sys.version.split()[0]}. Put a newer python3 first on PATH, or run "
        "make PYTHON=python3.11 (or newer)."
    )

from forktools.cli import main  # noqa: E402

sys.exit(main())

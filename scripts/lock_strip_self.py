"""Drop pip-compile's entry for the project itself (``switchyard @ file://...``) from a lock.

pip-compile lists the project when its extras name each other; the project is installed
editable by scripts/bootstrap.sh, and an unhashed file URL would make ``--require-hashes``
refuse the whole lock.
"""

import re
import sys
from pathlib import Path

SELF_ENTRY = re.compile(
    r"(# WARNING: pip install will require.*\n)?(# Consider using a hashable URL.*\n)?"
    r"switchyard @ file://.*\n(    #.*\n)*"
)


def main(path: str) -> None:
    lock = Path(path)
    lock.write_text(SELF_ENTRY.sub("", lock.read_text()))


if __name__ == "__main__":
    main(sys.argv[1])

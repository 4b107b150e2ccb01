"""python -m grader.exercises generate|check: the student copies (see
`grader.exercises.catalogue`)."""

import sys

from grader.exercises.catalogue import main

if __name__ == "__main__":
    sys.exit(main())

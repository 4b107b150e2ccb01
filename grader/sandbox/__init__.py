"""Where a student's code runs: the grading child (`grading_child`), the limits it puts on
itself before any student cell (`limits`: resources and Landlock files), the processes it may
start (`processes`), the messages between it and the grader (`wire`) and the grader's end of
it (`remote`).
"""

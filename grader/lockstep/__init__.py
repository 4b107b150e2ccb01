"""The lockstep engine: replay the same calls on the reference and on a student's code and
compare after every step (`engine`), the plain calls and world specs it sends (`calls`), the
report it hands back (`report`) and a time limit per scenario (`time_limit`).

It names no exercise: the worlds a spec can ask for are registered by `grader.exercises`.
"""

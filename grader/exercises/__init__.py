"""The exercises: their catalogue and student copies (`catalogue`), the worlds each is graded
in, the checks and their scenarios, the rules each check covers, the broken variants that prove
the checks work (with the grader's own copies of the reference they edit), and which reference
code is each exercise's answer (`reference_code`, `answer_free`).

`python -m grader.exercises generate|check` writes or checks the student copies.
"""

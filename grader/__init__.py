"""The lab's grader: ``python -m grader``, a sandboxed command line around nbgrader.

* ``check NOTEBOOK``: grade a learner's notebook against its assignment's hidden tests
  (score table, a hint per failed test, feedback HTML); learner code runs in a child
  process with wall-clock and memory limits, in a scratch copy of the course.
* ``release``: write the learner version of every assignment, refusing to if it would
  show a solution or a hidden test.

Modules, one concept each: ``course`` (the course and its assignments, input checks),
``sandbox`` (the limited child process), ``steps`` (nbgrader's steps, inside the child),
``check`` (grading), ``release`` (learner versions), ``report`` (tables and JSON),
``cli`` (the command line).
"""

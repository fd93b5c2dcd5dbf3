"""nbgrader configuration of the lab's course: this folder is the course root.

Instructors run ``nbgrader`` from here (``nbgrader generate_assignment 01_ring_allreduce``),
and ``python -m grader`` copies this file into a temporary course to grade a learner's
notebook. Everything is relative to this file, so a copy works wherever it lands.
"""
import os

c = get_config()  # noqa: F821 - provided by traitlets when it loads this file

# The course root is the folder holding this file: source/, release/, submitted/,
# autograded/, feedback/ and gradebook.db all live under it (the last four are git-ignored).
c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.course_id = "dl-systems-lab"

# Solution regions (``### BEGIN SOLUTION`` ... ``### END SOLUTION``) become a stub that fails
# loudly, so an unfinished function gives a clear NotImplementedError, never a silent pass.
c.ClearSolutions.begin_solution_delimeter = "BEGIN SOLUTION"
c.ClearSolutions.end_solution_delimeter = "END SOLUTION"
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# Hidden tests (``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS``) are stored in the
# gradebook and removed from the learner's copy; autograde puts them back.
c.ClearHiddenTests.begin_test_delimeter = "BEGIN HIDDEN TESTS"
c.ClearHiddenTests.end_test_delimeter = "END HIDDEN TESTS"

# A learner who deletes a test cell gets it back at grading time instead of skipping it.
c.OverwriteCells.add_missing_cells = True

# Per-cell limit on learner code while autograding (seconds); a cell that runs longer is
# interrupted and marked failed, and the rest of the notebook still runs. The grader CLI
# adds a wall-clock limit on the whole run on top of this.
c.ExecutePreprocessor.timeout = 60
c.ExecutePreprocessor.interrupt_on_timeout = True

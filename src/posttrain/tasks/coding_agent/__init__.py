"""The `coding-agent` task: a multi-turn agent fixes issues in small repositories with sandboxed tools.

repo.py     the episode's own copy of a repo and the operations on it (paths, read, search, edit)
episode.py  the tools bound to one episode, run_tests, and the grade when the episode ends
data.py     repositories and issues (feature-deletion repos and the bug repos in data/)
task.py     rows, rubric, demonstrations, smoke checks, make_task
"""

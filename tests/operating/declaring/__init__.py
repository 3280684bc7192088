"""A package of apps whose jobs.py/tasks.py are broken on purpose, for the system checks."""

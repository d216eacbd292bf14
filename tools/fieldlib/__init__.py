"""The field matrix (tools/field.py): real third-party training jobs, armed and unarmed, with a planted truth."""

#!/usr/bin/env python
"""The Django credits example's manage.py (``python manage.py migrate``, ``runserver``,
``relaybox worker``)."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_credits.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)

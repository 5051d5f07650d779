"""Seed 000's credits example: a paid invoice grants 100 credits to a workspace, once."""

"""The credits example: a paid invoice grants 100 credits to a workspace, once."""

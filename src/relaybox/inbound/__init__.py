"""Receiving: providers deliver to the receiver, the acceptor stores each delivery in
the inbox, the worker runs its handler; recovery, reconciliation, replay, projections.
"""

"""Search: strategies that propose points, and what they learn from (priors, transfer sources, seeding).

A strategy never touches a GPU: it is handed feasible rows and told results.
"""

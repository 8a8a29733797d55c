"""echo2.planner"""

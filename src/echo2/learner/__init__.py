"""echo2.learner"""

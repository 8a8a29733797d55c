"""echo2.rollout"""

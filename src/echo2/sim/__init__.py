"""echo2.sim"""

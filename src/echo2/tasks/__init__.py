"""echo2.tasks"""

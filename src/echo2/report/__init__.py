"""echo2.report"""

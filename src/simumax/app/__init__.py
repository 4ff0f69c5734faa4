"""The Streamlit web app (optional extra ``simumax[app]``; ``simumax app`` starts it)."""

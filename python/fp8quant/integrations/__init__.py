"""fp8quant inside other libraries' models. Each integration imports its library only when it is
imported itself: ``fp8quant.integrations.transformers`` (Hugging Face transformers'
FineGrainedFP8 models)."""

from experiments.pipeline import PipelineConfig
def get_config():
    return PipelineConfig(name="smol_try", base_model="/tmp/smol_hf", mw_config="mw_smollm2", mr_config="mr_smollm2",
                          parallel_adapters=False, outside_docs=0, n_edits=200)

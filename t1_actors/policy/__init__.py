"""The MoE policy: model (routing capture, R3 replay), sampling, tokenizer and chat template.

    policy = MoEPolicy(ModelConfig())                     # or from_pretrained(hf_dir) / MoEPolicy.load(dir)
    policy = Qwen35MoePolicy(Qwen35MoeConfig())           # Qwen3.5-MoE: hybrid DeltaNet / attention
    out = policy(ids, capture_routing=True)               # .logits .routing [B,T,L,k] .hidden_states
    out = policy(ids, routing_replay=record)              # R3: experts from the record, gates live
    gens = generate(policy, prompts, SamplingParams(max_new_tokens=64, temperature=1.0, seed=0))
    policy.save(dir)                                      # HF layout (transformers, SGLang load it)

    tok = load_tokenizer(path)                           # t1's tokenizer.json or an HF dir (chat template too)

Tokenizer: ``t1_actors.policy.chat_tokenizer`` (loading, HF templates), ``t1_actors.policy.tokenizer``
(t1's BPE); t1's own chat template: ``t1_actors.policy.chat_template``.
"""

from t1_actors.policy._hf import from_pretrained
from t1_actors.policy.chat_tokenizer import ChatTokenizer, load_tokenizer
from t1_actors.policy.config import ModelConfig, Qwen35MoeConfig
from t1_actors.policy.generation import Generation
from t1_actors.policy.kv_cache import KVCache
from t1_actors.policy.model import MoEBackbone, MoEPolicy, PolicyOutput
from t1_actors.policy.qwen35 import HybridCache, Qwen35MoePolicy
from t1_actors.policy.routing import r3_gate, topk_gate
from t1_actors.policy.sampling import ContinuousBatcher, SamplingParams, generate

__all__ = ["ChatTokenizer", "load_tokenizer", "ModelConfig", "Qwen35MoeConfig", "Qwen35MoePolicy", "HybridCache",
           "MoEPolicy", "MoEBackbone", "PolicyOutput", "KVCache", "from_pretrained",
           "r3_gate", "topk_gate", "ContinuousBatcher", "Generation", "SamplingParams", "generate"]

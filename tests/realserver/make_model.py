"""A tiny random-weight Llama with a locally trained BPE tokenizer (no hub reachable)."""
import sys
from pathlib import Path
from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
import torch

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
words = ("the quick brown fox jumps over a lazy dog soak test server token stream "
         "latency bucket level model request response alpha beta gamma delta").split()
corpus = [" ".join(words[(i * 7 + j) % len(words)] for j in range(40)) for i in range(2000)]
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<unk>", "<s>", "</s>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(corpus, trainer)
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
fast.save_pretrained(out)
cfg = LlamaConfig(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
                  bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16")
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out)
print("saved", out)

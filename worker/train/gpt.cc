// The gpt model (gpt.h).
#include "worker/train/gpt.h"

#include <cmath>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/train/attention.h"
#include "worker/train/model_export.h"

namespace lockstep::worker {
namespace {

namespace nn = torch::nn;

void InitLinear(nn::Linear& linear, double std) {
  torch::NoGradGuard no_grad;
  linear->weight.normal_(0.0, std);
  if (linear->bias.defined()) linear->bias.zero_();
}

class CausalSelfAttentionImpl : public nn::Module {
 public:
  CausalSelfAttentionImpl(const GptOptions& o)
      : n_head_(o.n_head),
        fused_(o.fused),
        c_attn_(register_module("c_attn", nn::Linear(o.n_embd, 3 * o.n_embd))),
        c_proj_(register_module("c_proj", nn::Linear(o.n_embd, o.n_embd))),
        attn_dropout_(register_module("attn_dropout", nn::Dropout(o.dropout))),
        resid_dropout_(
            register_module("resid_dropout", nn::Dropout(o.dropout))) {
    InitLinear(c_attn_, 0.02);
    InitLinear(c_proj_, 0.02 / std::sqrt(2.0 * o.n_layer));
  }

  // `hidden`: the causal mask [T, T], 0 where a position may attend and
  // -inf above the diagonal, in fp32; the model keeps one for all its
  // layers and steps.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& hidden) {
    const torch::Tensor projected = c_attn_->forward(x);
    const bool dropout = is_training() && attn_dropout_->options.p() > 0;
    if (fused_ && !dropout && FusedCausalAttentionTakes(projected, n_head_)) {
      return resid_dropout_->forward(
          c_proj_->forward(FusedCausalAttention(projected, n_head_)));
    }
#if TORCH_VERSION_MAJOR >= 2
    if (fused_ && projected.is_cuda()) {
      const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
      const int64_t hs = c / n_head_;
      std::vector<torch::Tensor> parts = projected.split(c, 2);
      auto heads = [&](const torch::Tensor& m) {
        return m.view({b, t, n_head_, hs}).transpose(1, 2);
      };
      torch::Tensor y = at::scaled_dot_product_attention(
          heads(parts[0]), heads(parts[1]), heads(parts[2]), {},
          dropout ? attn_dropout_->options.p() : 0.0, /*is_causal=*/true);
      return resid_dropout_->forward(
          c_proj_->forward(y.transpose(1, 2).contiguous().view({b, t, c})));
    }
#endif
    return resid_dropout_->forward(c_proj_->forward(
        UnfusedCausalAttention(projected, n_head_, hidden, &attn_dropout_)));
  }

 private:
  const int64_t n_head_;
  const bool fused_;
  nn::Linear c_attn_;
  nn::Linear c_proj_;
  nn::Dropout attn_dropout_;
  nn::Dropout resid_dropout_;
};
TORCH_MODULE(CausalSelfAttention);

class BlockImpl : public nn::Module {
 public:
  BlockImpl(const GptOptions& o)
      : ln_1_(register_module("ln_1",
                              nn::LayerNorm(nn::LayerNormOptions({o.n_embd})))),
        attn_(register_module("attn", CausalSelfAttention(o))),
        ln_2_(register_module("ln_2",
                              nn::LayerNorm(nn::LayerNormOptions({o.n_embd})))),
        c_fc_(register_module("c_fc", nn::Linear(o.n_embd, 4 * o.n_embd))),
        c_proj_(register_module("c_proj", nn::Linear(4 * o.n_embd, o.n_embd))),
        dropout_(register_module("dropout", nn::Dropout(o.dropout))) {
    InitLinear(c_fc_, 0.02);
    InitLinear(c_proj_, 0.02 / std::sqrt(2.0 * o.n_layer));
  }

  torch::Tensor forward(torch::Tensor x, const torch::Tensor& hidden) {
    x = x + attn_->forward(ln_1_->forward(x), hidden);
    torch::Tensor h = torch::gelu(c_fc_->forward(ln_2_->forward(x)));
    return x + dropout_->forward(c_proj_->forward(h));
  }

 private:
  nn::LayerNorm ln_1_;
  CausalSelfAttention attn_;
  nn::LayerNorm ln_2_;
  nn::Linear c_fc_;
  nn::Linear c_proj_;
  nn::Dropout dropout_;
};
TORCH_MODULE(Block);

class Gpt : public Network {
 public:
  explicit Gpt(const GptOptions& o)
      : n_head_(o.n_head),
        wte_(register_module("wte", nn::Embedding(o.vocab, o.n_embd))),
        wpe_(register_module("wpe", nn::Embedding(o.block, o.n_embd))),
        drop_(register_module("drop", nn::Dropout(o.dropout))),
        h_(register_module("h", nn::ModuleList())),
        ln_f_(register_module(
            "ln_f", nn::LayerNorm(nn::LayerNormOptions({o.n_embd})))) {
    for (int64_t i = 0; i < o.n_layer; ++i) h_->push_back(Block(o));
    torch::NoGradGuard no_grad;
    wte_->weight.normal_(0.0, 0.02);
    wpe_->weight.normal_(0.0, 0.02);
  }

  torch::Tensor Features(const torch::Tensor& tokens) override {
    const int64_t t = tokens.size(1);
    torch::Tensor positions = torch::arange(
        t, torch::TensorOptions().dtype(torch::kInt64).device(tokens.device()));
    torch::Tensor x =
        drop_->forward(wte_->forward(tokens) + wpe_->forward(positions));
    const torch::Tensor& hidden = HiddenPositions(t, tokens.device());
    for (const auto& block : *h_) x = block->as<Block>()->forward(x, hidden);
    return ln_f_->forward(x);
  }

  // The output layer is the token embedding, transposed (weight tying). It
  // runs in the job's precision: with a large vocabulary it is a large
  // share of the model's products (the loss is still taken in fp32).
  torch::Tensor Logits(const torch::Tensor& features) override {
    return torch::matmul(features, wte_->weight.t());
  }
  bool output_layer_in_precision() const override { return true; }

  // Features and Logits in evaluation mode (no dropout), op for op.
  absl::StatusOr<std::string> TorchScriptSource() const override {
    const int64_t c = wte_->options.embedding_dim();
    const int64_t hs = c / n_head_;
    const std::string heads =
        absl::StrCat(".view(b, t, ", n_head_, ", ", hs, ").transpose(1, 2)");
    std::string code = absl::StrCat(
        "def forward(self, idx):\n"
        "    b = idx.size(0)\n"
        "    t = idx.size(1)\n"
        "    pos = torch.arange(t, device=idx.device)\n"
        "    x = torch.embedding(self.wte_weight, idx) + "
        "torch.embedding(self.wpe_weight, pos)\n"
        "    hidden = torch.ones([t, t], device=idx.device).tril() == 0\n");
    for (size_t i = 0; i < h_->size(); ++i) {
      const std::string p = absl::StrCat("h_", i, "_");
      std::map<std::string, std::shared_ptr<nn::Module>> layers;
      for (const auto& child : h_->ptr(i)->named_children()) {
        layers[child.key()] = child.value();
      }
      std::map<std::string, std::shared_ptr<nn::Module>> attn;
      for (const auto& child : layers["attn"]->named_children()) {
        attn[child.key()] = child.value();
      }
      absl::StrAppend(
          &code, "    qkv = ",
          torchscript::Linear(
              torchscript::LayerNorm("x", p + "ln_1_",
                                     *layers["ln_1"]->as<nn::LayerNorm>()),
              p + "attn_c_attn_", *attn["c_attn"]->as<nn::Linear>()),
          ".split(", c, ", 2)\n", "    q = qkv[0]", heads, "\n",
          "    k = qkv[1]", heads, "\n", "    v = qkv[2]", heads, "\n",
          "    att = torch.matmul(q, k.transpose(-2, -1)) * ",
          torchscript::Number(1.0 / std::sqrt(double(hs))), "\n",
          "    att = torch.softmax(att.masked_fill(hidden, float(\"-inf\")), "
          "-1)\n",
          "    y = torch.matmul(att, v).transpose(1, 2).contiguous().view(b, "
          "t, ",
          c, ")\n", "    x = x + ",
          torchscript::Linear("y", p + "attn_c_proj_",
                              *attn["c_proj"]->as<nn::Linear>()),
          "\n", "    h = torch.gelu(",
          torchscript::Linear(
              torchscript::LayerNorm("x", p + "ln_2_",
                                     *layers["ln_2"]->as<nn::LayerNorm>()),
              p + "c_fc_", *layers["c_fc"]->as<nn::Linear>()),
          ")\n", "    x = x + ",
          torchscript::Linear("h", p + "c_proj_",
                              *layers["c_proj"]->as<nn::Linear>()),
          "\n");
    }
    absl::StrAppend(&code,
                    "    x = ", torchscript::LayerNorm("x", "ln_f_", *ln_f_),
                    "\n    return torch.matmul(x, self.wte_weight.t())\n");
    return code;
  }

  // Decay only the matrices of the blocks: not biases, LayerNorms or the
  // embeddings (the output layer is the token embedding).
  std::vector<bool> WeightDecayMask() const override {
    std::vector<bool> mask;
    for (const auto& p : named_parameters()) {
      const std::string& name = p.key();
      mask.push_back(p.value().dim() >= 2 && name != "wte.weight" &&
                     name != "wpe.weight");
    }
    return mask;
  }

 private:
  // The causal mask for windows of t tokens, kept until t or the device
  // changes (evaluation may run shorter windows).
  const torch::Tensor& HiddenPositions(int64_t t, const torch::Device& device) {
    if (!hidden_.defined() || hidden_.size(0) != t ||
        hidden_.device() != device) {
      hidden_ = CausalMask(t).to(device);
    }
    return hidden_;
  }

  const int64_t n_head_;
  torch::Tensor hidden_;
  nn::Embedding wte_;
  nn::Embedding wpe_;
  nn::Dropout drop_;
  nn::ModuleList h_;
  nn::LayerNorm ln_f_;
};

}  // namespace

std::shared_ptr<Network> MakeGpt(const GptOptions& options) {
  return std::make_shared<Gpt>(options);
}

}  // namespace lockstep::worker

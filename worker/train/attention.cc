// The fused causal attention as an autograd function (attention.h).
#include "worker/train/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "worker/train/attention_kernels.h"

namespace lockstep::worker {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

AttentionShape ShapeOf(const torch::Tensor& qkv, int64_t n_head) {
  AttentionShape shape;
  shape.batch = qkv.size(0);
  shape.tokens = qkv.size(1);
  shape.heads = n_head;
  shape.head_size = qkv.size(2) / 3 / n_head;
  return shape;
}

class CausalAttentionFunction
    : public torch::autograd::Function<CausalAttentionFunction> {
 public:
  static torch::Tensor forward(AutogradContext* context,
                               const torch::Tensor& input, int64_t n_head,
                               int64_t isa) {
    const torch::Tensor qkv = input.contiguous();
    const AttentionShape shape = ShapeOf(qkv, n_head);
    torch::Tensor y =
        torch::empty({shape.batch, shape.tokens, shape.heads * shape.head_size},
                     qkv.options());
    torch::Tensor lse = torch::empty({shape.batch, shape.heads, shape.tokens},
                                     qkv.options().dtype(torch::kFloat32));
    const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_size));
    CausalAttentionForward(qkv.data_ptr(), y.data_ptr(), lse.data_ptr<float>(),
                           shape, scale, qkv.scalar_type() == torch::kBFloat16,
                           static_cast<VectorIsa>(isa));
    context->save_for_backward({qkv, y, lse});
    context->saved_data["n_head"] = n_head;
    context->saved_data["isa"] = isa;
    return y;
  }

  static tensor_list backward(AutogradContext* context, tensor_list grads) {
    const auto saved = context->get_saved_variables();
    const torch::Tensor& qkv = saved[0];
    const int64_t n_head = context->saved_data["n_head"].toInt();
    const AttentionShape shape = ShapeOf(qkv, n_head);
    const torch::Tensor dy = grads[0].to(qkv.scalar_type()).contiguous();
    torch::Tensor dqkv = torch::empty_like(qkv);
    const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_size));
    CausalAttentionBackward(
        qkv.data_ptr(), saved[1].data_ptr(), saved[2].data_ptr<float>(),
        dy.data_ptr(), dqkv.data_ptr(), shape, scale,
        qkv.scalar_type() == torch::kBFloat16,
        static_cast<VectorIsa>(context->saved_data["isa"].toInt()));
    return {dqkv, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool FusedCausalAttentionTakes(const torch::Tensor& qkv, int64_t n_head) {
  return qkv.defined() && qkv.device().is_cpu() && qkv.dim() == 3 &&
         (qkv.scalar_type() == torch::kFloat32 ||
          qkv.scalar_type() == torch::kBFloat16) &&
         n_head > 0 && qkv.size(2) % (3 * n_head) == 0 && qkv.size(1) > 0 &&
         qkv.size(0) > 0;
}

torch::Tensor FusedCausalAttention(const torch::Tensor& qkv, int64_t n_head,
                                   VectorIsa isa) {
  return CausalAttentionFunction::apply(qkv, n_head, static_cast<int64_t>(isa));
}

torch::Tensor UnfusedCausalAttention(const torch::Tensor& qkv, int64_t n_head,
                                     const torch::Tensor& mask,
                                     torch::nn::Dropout* dropout) {
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3;
  const int64_t hs = c / n_head;
  std::vector<torch::Tensor> parts = qkv.split(c, 2);
  auto heads = [&](const torch::Tensor& m) {
    return m.view({b, t, n_head, hs}).transpose(1, 2);
  };
  torch::Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  // The scores scaled and masked in one pass, mask + scale * (q k^T): the
  // values (and fp32 results) of scaling then masked_fill, with one pass
  // over [B, H, T, T] less each way.
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1));
  torch::Tensor att = torch::add(mask.to(scores.scalar_type()), scores,
                                 1.0 / std::sqrt(double(hs)));
  att = torch::softmax(att, -1);
  if (dropout != nullptr) att = (*dropout)->forward(att);
  return torch::matmul(att, v).transpose(1, 2).contiguous().view({b, t, c});
}

torch::Tensor CausalMask(int64_t t) {
  return torch::zeros({t, t}).masked_fill(
      torch::ones({t, t}, torch::kBool).triu(1),
      -std::numeric_limits<float>::infinity());
}

}  // namespace lockstep::worker

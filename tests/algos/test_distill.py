"""The on-policy distillation term (algos/distill.py): zero when the teacher is the student, and its gradient
pushes each sampled token by how much more the teacher likes it."""

import torch

from posttrain.algos.distill import reverse_kl_loss


def _logp(B=2, T=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(B, T, 7, generator=g), -1)[..., 0]


def test_zero_loss_and_gradient_when_teacher_equals_student():
    logp = _logp().requires_grad_(True)
    mask = torch.ones_like(logp)
    loss, m = reverse_kl_loss(logp, logp.detach(), logp.detach().clone(), mask, 1.0, "token-mean")
    loss.backward()
    assert float(loss) == 0.0 and m["teacher/kl"] == 0.0
    assert torch.count_nonzero(logp.grad) == 0


def test_gradient_is_teacher_minus_student_per_token():
    logp = _logp().requires_grad_(True)
    teacher = _logp(seed=1)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.float32)
    loss, m = reverse_kl_loss(logp, logp.detach(), teacher, mask, 0.5, "token-mean", total_tokens=8.0)
    loss.backward()
    expected = -0.5 * (teacher - logp.detach()) * mask / 8.0
    assert torch.allclose(logp.grad, expected, atol=1e-6)
    assert abs(m["teacher/kl"] - float(((logp.detach() - teacher) * mask).sum() / 8)) < 1e-5


def test_a_gradient_step_moves_the_student_toward_the_teacher():
    """One categorical distribution; sampling from the student and following the term lowers KL(student||teacher)."""
    torch.manual_seed(0)
    logits = torch.zeros(6, requires_grad=True)
    teacher = torch.log_softmax(torch.tensor([3.0, 0.0, 0.0, -1.0, 0.0, 1.0]), -1)
    opt = torch.optim.SGD([logits], lr=0.5)

    def kl():
        p = torch.log_softmax(logits.detach(), -1)
        return float((p.exp() * (p - teacher)).sum())

    before = kl()
    for _ in range(200):
        logp_all = torch.log_softmax(logits, -1)
        y = torch.multinomial(logp_all.detach().exp(), 64, replacement=True)
        logp = logp_all[y][None]
        loss, _ = reverse_kl_loss(logp, logp.detach(), teacher[y][None], torch.ones_like(logp), 1.0, "token-mean")
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert kl() < 0.1 * before, (before, kl())


def test_shape_mismatch_is_refused():
    logp = _logp()
    try:
        reverse_kl_loss(logp, logp, logp[:, :3], torch.ones_like(logp), 1.0, "token-mean")
    except ValueError as e:
        assert "do not fit" in str(e)
    else:
        raise AssertionError("a teacher of another length was accepted")

"""RLHF PPO step with roles on device groups: same numbers as the roles one after another, overlap."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import nn

from mindspore_hyper.rlhf import PPOModels, PPOSettings, PPOTrainer, TinyPolicy, TinyReward, TinyValue, ppo_step
from paths import CONFIGS

pytestmark = pytest.mark.usefixtures("pynative")

RLHF_CONFIG = CONFIGS / "rlhf_process_groups.yaml"


def roles(seed=0):
    ms.set_seed(seed)
    actor, reference = TinyPolicy(), TinyPolicy()
    for p, q in zip(actor.trainable_params(), reference.trainable_params()):
        q.set_data(p.data.copy())
    return PPOModels(actor, TinyValue(), TinyReward(), reference)


def twin_roles():
    a, b = roles(), roles()
    for p, q in zip(a.get_parameters(), b.get_parameters()):
        q.set_data(p.data.copy())
    return a, b


def prompts(seed=0):
    return ms.Tensor(np.random.default_rng(seed).integers(0, 16, (8, 3)).astype(np.int32))


@pytest.fixture
def mpmd(clean_context):
    clean_context.set_context(hyper_mpmd=True, device_num=16)
    return clean_context


def test_ppo_on_groups_equals_roles_one_after_another(mpmd):
    grouped, plain = twin_roles()
    trainer = PPOTrainer(grouped, RLHF_CONFIG)
    assert trainer.role_group == {"actor": "actor", "critic": "critic", "reward_model": "reward",
                                  "reference": "actor"}
    assert trainer.runners["critic"].models["critic"].mesh.size == 4  # data parallel over ranks 8-11
    actor_opt = nn.Adam(plain.actor.trainable_params(), learning_rate=1e-3)
    critic_opt = nn.Adam(plain.critic.trainable_params(), learning_rate=1e-3)
    reference_before = {p.name: p.asnumpy().copy() for p in grouped.reference.get_parameters()}
    for step in range(2):
        got = trainer.step(prompts(step))
        want = ppo_step(plain, actor_opt, critic_opt, prompts(step))
        np.testing.assert_array_equal(got.sequences, want.sequences)
        np.testing.assert_allclose(got.scores, want.scores, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got.advantages, want.advantages, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose([got.actor_loss, got.critic_loss, got.kl],
                                   [want.actor_loss, want.critic_loss, want.kl], rtol=1e-4, atol=1e-7)
    for p, q in zip(grouped.get_parameters(), plain.get_parameters()):
        np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), rtol=1e-5, atol=1e-6, err_msg=p.name)
    for p in grouped.reference.get_parameters():
        np.testing.assert_array_equal(p.asnumpy(), reference_before[p.name])
    assert not np.allclose(grouped.actor.head.weight.asnumpy(), reference_before["reference.head.weight"])


def test_timeline_overlaps_disjoint_groups_and_queues_colocated_roles(mpmd):
    trainer = PPOTrainer(roles(), RLHF_CONFIG)
    trainer.step(prompts())
    tl = trainer.timeline
    task = {t.label: t for t in tl.spans}
    generated = task["generate 3"].end
    # scoring: reward, critic and the actor's own pass start together once generation ended
    assert task["score"].start == task["values"].start == task["old logp"].start == generated
    assert task["score"].lane == "reward" and task["values"].lane == "critic"
    # the reference shares the actor's devices: it queues behind the actor's pass
    assert task["reference logp"].lane == "actor" and task["reference logp"].start == task["old logp"].end
    # training: actor and critic updates run concurrently after every scoring pass
    scoring_end = max(task[k].end for k in ("score", "values", "old logp", "reference logp"))
    assert task["actor update"].start == task["critic update"].start == scoring_end
    assert (task["actor update"].args["index"], task["critic update"].args["index"]) in tl.overlaps()
    assert tl.makespan < tl.serial_time


def test_colocating_a_role_without_a_group(mpmd):
    config = {"parallel_config": {"device_matrix": [8], "alias_names": ["data"]},
              "process_groups": {"actor": {"ranks": ["0-3"]}, "reward": {"ranks": ["4-7"], "modules": "reward_model"}}}
    mpmd.set_context(device_num=8)
    grouped, plain = twin_roles()
    trainer = PPOTrainer(grouped, config, colocate={"reference": "actor", "critic": "reward_model"})
    assert trainer.role_group["critic"] == "reward"
    got = trainer.step(prompts())
    want = ppo_step(plain, nn.Adam(plain.actor.trainable_params(), learning_rate=1e-3),
                    nn.Adam(plain.critic.trainable_params(), learning_rate=1e-3), prompts())
    np.testing.assert_allclose([got.actor_loss, got.critic_loss], [want.actor_loss, want.critic_loss], rtol=1e-4)
    task = {t.label: t for t in trainer.timeline.spans}
    assert task["values"].lane == "reward" and task["values"].start >= task["score"].end  # time-shared
    with pytest.raises(ValueError, match="role 'critic' runs in no device group"):
        PPOTrainer(roles(), config)


def test_bad_trainer_inputs(mpmd):
    with pytest.raises(ValueError, match=r"colocate\['reference'\] = 'judge'"):
        PPOTrainer(roles(), RLHF_CONFIG, colocate={"reference": "judge"})
    mpmd.set_context(device_num=8)
    with pytest.raises(ValueError, match="set_context\\(device_num=16\\)"):
        PPOTrainer(roles(), RLHF_CONFIG)
    mpmd.set_context(hyper_mpmd=False, device_num=16)
    with pytest.raises(ValueError, match="hyper_mpmd=True"):
        PPOTrainer(roles(), RLHF_CONFIG)
    mpmd.set_context(hyper_mpmd=True, mode="native")
    with pytest.raises(ValueError, match="simulation or under msrun \\(distributed\\); mode='native'"):
        PPOTrainer(roles(), RLHF_CONFIG)
    # under msrun (a plain python process is a job of one): refused before any process waits
    mpmd.set_context(mode="distributed")
    with pytest.raises(ValueError, match="span 16 devices but the job has 1 processes; launch with msrun "
                                         "--worker_num=16"):
        PPOTrainer(roles(), RLHF_CONFIG)
    one_dynamic = {"parallel_config": {"device_num": 4},
                   "process_groups": {"actor": {"ranks": [0, 1], "hardware": "CPU", "scheduler": "dynamic"},
                                      "critic": {"ranks": 2, "hardware": "CPU"},
                                      "reward": {"ranks": 3, "hardware": "CPU", "modules": "reward_model"}}}
    with pytest.raises(ValueError, match="process_groups.actor.scheduler: dynamic: group 'actor' is the only dynamic"):
        PPOTrainer(roles(), one_dynamic)
    with pytest.raises(ValueError, match="response_len=0"):
        PPOSettings(response_len=0)
    with pytest.raises(ValueError, match="clip=1.5"):
        PPOSettings(clip=1.5)


def test_prompt_batch_must_match_the_actor_group_batch_size(mpmd):
    trainer = PPOTrainer(roles(), RLHF_CONFIG)
    bad = ms.Tensor(np.zeros((4, 3), np.int32))
    with pytest.raises(ValueError,
                       match="process_groups.actor.batch_size: 8, but Cell 'actor' got input 0 with batch 4"):
        trainer.step(bad)


def test_process_phases_in_a_job_of_one():
    """ProcessPhases without peers: units of its group run here, rows split into blocks are put
    back in order, and bad units are named."""
    import contextlib

    from mindspore_hyper.rlhf import ProcessPhases, Unit

    bare_calls = []

    @contextlib.contextmanager
    def bare(role):
        bare_calls.append(role)
        yield

    phases = ProcessPhases(0, 1, {"actor": (0,), "reward_model": (0,)}, bare=bare)
    data = np.arange(12.0).reshape(6, 2)
    units = [Unit("scoring", "actor", "double", lambda: data * 2),
             Unit("scoring", "reward_model", "score", lambda: data.sum(1), lambda rows: data[rows].sum(1))]
    double, score = phases("scoring", units)
    np.testing.assert_array_equal(double, data * 2)
    np.testing.assert_array_equal(score, data.sum(1))
    assert not bare_calls
    phases.row_blocks = [((0,), slice(0, 4)), ((0,), slice(4, 6))]
    double, score = phases("scoring", units)
    np.testing.assert_array_equal(score, data.sum(1))
    assert bare_calls == ["reward_model", "reward_model"]
    labels = [e.label for e in phases.events if e.kind == "run"]
    assert labels == ["double", "score", "double", "score rows 0-3", "score rows 4-5"]
    assert phases.seconds["scoring"] > 0
    with pytest.raises(TypeError, match="scoring unit 'loss' of role 'actor' returned float"):
        phases("scoring", [Unit("scoring", "actor", "loss", lambda: 1.0)])
    with pytest.raises(ValueError, match="role 'critic' is in no device group"):
        phases("scoring", [Unit("scoring", "critic", "values", lambda: data)])

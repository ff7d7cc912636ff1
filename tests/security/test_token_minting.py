"""Who may mint a personal API token through the web, and who sees its key.

A token acts as its owner, with every permission the owner has. A staff user with the admin's
``add_apitoken`` permission could mint one for a superuser and was shown its key: a superuser's
powers for anyone who may add tokens. Now, through the admin, a person mints only their own token
(never one for a superuser unless they are that superuser, never one for someone with
permissions they lack), and the key is shown once, to its owner, on the page that answers the
form: not kept as a message in a cookie or the session, never cached.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from recovery.models import ApiToken
from recovery.models.api_token import web_minting_refusal
from recovery.roles import ADMIN, OPERATOR, VIEWER

pytestmark = pytest.mark.django_db

ADD = "/admin/recovery/apitoken/add/"
KEY = re.compile(r"wrp_[A-Za-z0-9_-]{20,}")


def token_permissions(*verbs: str) -> list[Permission]:
    return list(
        Permission.objects.filter(
            content_type__app_label="recovery", codename__in=[f"{v}_apitoken" for v in verbs]
        )
    )


@pytest.fixture
def root(make_user: Callable[..., User]) -> User:
    return make_user("root", is_staff=True, is_superuser=True)


@pytest.fixture
def sam(make_user: Callable[..., User]) -> User:
    """Staff, an operator, and allowed to add, view and change tokens in the admin."""
    user = make_user("sam", OPERATOR, is_staff=True)
    user.user_permissions.add(*token_permissions("add", "view", "change"))
    return User.objects.get(pk=user.pk)


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def keys_in(text: str) -> list[str]:
    return KEY.findall(text)


def assert_refused(response: object, owner: User, reason: str) -> None:
    assert getattr(response, "status_code", None) == 200  # the form again, with the reason
    content = getattr(response, "content", b"").decode()
    assert reason in content
    assert keys_in(content) == []
    assert not ApiToken.objects.filter(user=owner).exists()
    cookies = getattr(response, "cookies", {})
    assert all(keys_in(str(morsel.value)) == [] for morsel in cookies.values())


def test_a_staff_user_cannot_mint_a_token_for_a_superuser(sam: User, root: User) -> None:
    """
    GIVEN a staff user who may add tokens in the admin, and a superuser
    WHEN the staff user adds a token whose user is the superuser
    THEN it is refused, saying only a superuser may; no token exists for the superuser and no key
        is shown
    """
    response = signed_in(sam).post(ADD, {"user": root.pk, "name": "escalate"})

    assert_refused(response, root, "only a superuser may mint a token for a superuser")
    assert ApiToken.objects.count() == 0


def test_a_staff_user_cannot_mint_a_token_for_someone_with_more_permissions(
    sam: User, make_user: Callable[..., User]
) -> None:
    """
    GIVEN a staff operator who may add tokens, and a Console admin (who may edit clusters,
        policies and patterns)
    WHEN the operator adds a token for the admin
    THEN it is refused, naming permissions the operator lacks
    """
    ada = make_user("ada", ADMIN, is_staff=True)

    response = signed_in(sam).post(ADD, {"user": ada.pk, "name": "borrowed"})

    assert_refused(response, ada, "has permissions you lack (recovery.add_")


@pytest.mark.parametrize(
    ("minter_name", "owner_role", "owner_superuser"),
    [("sam", VIEWER, False), ("root", VIEWER, False), ("root", None, True)],
    ids=["staff-for-a-viewer", "superuser-for-a-viewer", "superuser-for-another-superuser"],
)
def test_nobody_is_shown_the_key_of_someone_elses_token(
    sam: User,
    root: User,
    make_user: Callable[..., User],
    minter_name: str,
    owner_role: str | None,
    owner_superuser: bool,
) -> None:
    """
    GIVEN a person who may add tokens, and someone else with no more permissions, or another
        superuser
    WHEN the person adds a token for them
    THEN it is refused: the key would be shown to someone other than its owner, who would act
        and appear in the trail as them
    """
    minter = {"sam": sam, "root": root}[minter_name]
    owner = make_user("other", owner_role, is_staff=owner_superuser, is_superuser=owner_superuser)

    response = signed_in(minter).post(ADD, {"user": owner.pk, "name": "for-them"})

    assert_refused(response, owner, f"manage.py create_api_token {owner.username}")


def test_a_person_mints_their_own_token_and_sees_its_key_once(sam: User) -> None:
    """
    GIVEN a staff operator who may add tokens
    WHEN they add a token for themselves
    THEN the answer shows its key, never cached; the key is in no cookie, no session, no later
        page, and only its hash is stored; it acts as them
    """
    client = signed_in(sam)

    response = client.post(ADD, {"user": sam.pk, "name": "grafana"})

    assert response.status_code == 200
    [key] = set(keys_in(response.content.decode()))
    assert "no-store" in response["Cache-Control"]
    assert all(key not in morsel.value for morsel in response.cookies.values())
    sessions = [session.get_decoded() for session in Session.objects.all()]
    assert sessions and all(key not in repr(data) for data in sessions)
    token = ApiToken.objects.get(user=sam, name="grafana")
    assert key not in (token.key_hash, token.key_prefix)
    for page in ("/admin/recovery/apitoken/", f"/admin/recovery/apitoken/{token.pk}/change/"):
        assert keys_in(client.get(page).content.decode()) == []
    me = APIClient()
    me.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert me.get("/api/v1/clusters/").status_code == 200


def test_a_name_used_twice_is_a_form_error(sam: User) -> None:
    client = signed_in(sam)
    client.post(ADD, {"user": sam.pk, "name": "ci"})

    response = client.post(ADD, {"user": sam.pk, "name": "ci"})

    assert response.status_code == 200
    assert keys_in(response.content.decode()) == []
    assert ApiToken.objects.filter(user=sam, name="ci").count() == 1


def test_a_revoked_token_stays_revoked(sam: User, root: User) -> None:
    """
    GIVEN a superuser's token, revoked because its key leaked
    WHEN a staff user who may change tokens clears its revocation in the admin
    THEN it stays revoked: revoking is for good
    """
    token, key = ApiToken.issue(root, "leaked")
    assert token.revoke()

    signed_in(sam).post(
        f"/admin/recovery/apitoken/{token.pk}/change/",
        {"user": root.pk, "name": "leaked", "revoked_at_0": "", "revoked_at_1": ""},
    )

    token.refresh_from_db()
    assert token.revoked_at is not None and token.revoked_at <= timezone.now()
    stolen = APIClient()
    stolen.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert stolen.get("/api/v1/clusters/").status_code == 401


def test_the_rule_for_the_web(sam: User, root: User, make_user: Callable[..., User]) -> None:
    viewer = make_user("vera", VIEWER)
    assert web_minting_refusal(sam, sam) is None
    assert web_minting_refusal(root, root) is None
    assert "only a superuser" in str(web_minting_refusal(sam, root))
    assert "create_api_token vera" in str(web_minting_refusal(root, viewer))
    User.objects.filter(pk=sam.pk).update(is_active=False)
    assert web_minting_refusal(User.objects.get(pk=sam.pk), sam) == "Your account is disabled."

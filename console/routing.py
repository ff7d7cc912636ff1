from django.urls import path

from console.consumers import LiveConsumer

websocket_urlpatterns = [
    path("ws/live/", LiveConsumer.as_asgi()),
    path("ws/workloads/<int:workload_id>/", LiveConsumer.as_asgi()),
]

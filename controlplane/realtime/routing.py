from django.urls import path

from .consumers import ClusterLiveConsumer, PingConsumer

websocket_urlpatterns = [
    path("ws/ping/", PingConsumer.as_asgi()),
    path("ws/clusters/<int:cluster_id>/", ClusterLiveConsumer.as_asgi()),
]
